// The TLS files of a gRPC job (distributed.tls: cert, key, ca), read and checked before gRPC gets
// them: gRPC reports a certificate it cannot use only as a server that does not start (taken
// for a port in use) or a handshake that fails (a rendezvous that times out).
#pragma once

#include <string>

namespace dtrain {

struct TlsFiles {
  std::string cert, key, ca;  // PEM text
};

// Reads the three files and checks them: the certificate and the CA file each hold at least one
// PEM certificate, the key file an unencrypted PEM private key that is the certificate's, and the
// certificate verifies against the CA (so it is current, and signed by it: every rank checks its
// peers against the same CA). UserError naming the key (`keys` prefixes them, e.g.
// "distributed.tls") and the file.
TlsFiles read_tls_files(const std::string& cert, const std::string& key, const std::string& ca,
                        const std::string& keys = "distributed.tls");

// "" when the certificate (PEM, the first in the text) names `host` as gRPC checks it when a rank
// dials it (an IP address against its IP subjectAltNames, a host name against its DNS names or,
// without any, its common name); else why not, with the names it has ("holds the names DNS:a,
// IP:10.0.0.2"). Without a match every handshake with that host fails, which the ranks see only
// as a rendezvous that times out.
std::string tls_name_problem(const std::string& cert_pem, const std::string& host);

}  // namespace dtrain
