#include "dtrain/verify_cmd.h"

#include <cstdlib>
#include <iostream>

#include "dtrain/cli.h"
#include "util/fault.h"
#include "util/interrupt.h"

namespace dtrain {

int cmd_verify(VerifyOptions o, bool json) {
  if (const char* f = std::getenv("DTRAIN_FAULT")) o.faults = parse_faults(f, 0);
  // A signal stops the run under way softly; run_verify then unwinds, removing its temporary
  // folder (the default action ended the process and left it, ~15 MB a time, in /tmp).
  StopRequest stop;
  const InterruptGuard interrupts(stop);
  o.stop = &stop;
  VerifyReport rep;
  try {
    rep = run_verify(o);
  } catch (const VerifyInterrupted& e) {
    std::cerr << e.what() << std::endl;
    return 128 + e.signal;
  }
  if (json)
    std::cout << report_json(rep).dump(2) << std::endl;
  else
    std::cout << report_text(rep) << std::flush;
  return rep.failed() ? kExitRuntime : kExitOk;
}

}  // namespace dtrain
