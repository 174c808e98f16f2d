// The TLS files are checked before gRPC gets them (comm/grpc/tls_files.h): a file that is no
// PEM certificate or key, a key of another certificate, an encrypted key, a certificate another
// CA signed. Before, gRPC's server did not start ("cannot listen ... port in use?") or, with the
// wrong CA, the rendezvous timed out.
#include <doctest/doctest.h>

#include <string>

#include "comm/grpc/tls_files.h"
#include "test_util.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::contains;

namespace {

// A CA, a certificate it signed (node), and a second CA with its own certificate (other), made
// with the openssl command; false when it cannot run here.
bool make_pki(const std::string& d) {
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const auto ca = [&](const std::string& n) {
    return "openssl req -x509" + ec + " -keyout " + n + ".key -out " + n +
           ".pem -days 2 -subj /CN=" + n;
  };
  const auto leaf = [&](const std::string& n, const std::string& by, const std::string& ext = "") {
    return "openssl req" + ec + " -keyout " + n + ".key -out " + n + ".csr -subj /CN=" + n +
           " && openssl x509 -req -in " + n + ".csr -CA " + by + ".pem -CAkey " + by +
           ".key -CAcreateserial -out " + n + ".pem -days 2" +
           (ext.empty() ? "" : " -extfile " + ext);
  };
  // An intermediate CA signed by ca, a node it signed; a node certificate for servers only.
  const std::string cmd = "cd " + d + " && " + ca("ca") + " && " + ca("ca2") + " && " +
                          leaf("node", "ca") + " && " + leaf("other", "ca2") +
                          " && printf 'basicConstraints=critical,CA:true\\nkeyUsage=keyCertSign\\n'"
                          " > int.cnf && " +
                          leaf("int", "ca", "int.cnf") + " && " + leaf("inode", "int") +
                          " && printf 'extendedKeyUsage=serverAuth\\n' > srv.cnf && " +
                          leaf("srv", "ca", "srv.cnf") +
                          " && openssl pkey -in node.key -aes256 -passout pass:x -out enc.key" +
                          " && echo 'seed: 1' > cfg.yaml";
  return dtrain::testing::run_cmd(cmd + " 2>&1").exit_code == 0;
}

std::string error_of(const std::string& cert, const std::string& key, const std::string& ca) {
  try {
    read_tls_files(cert, key, ca);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("TLS files: a good set reads, each wrong file is named with its key and the cause") {
  dtrain::testing::TempDir dir;
  const std::string d = dir.path() + "/";
  if (!make_pki(dir.path())) {
    MESSAGE("skipped: cannot make test certificates with openssl");
    return;
  }
  const TlsFiles f = read_tls_files(d + "node.pem", d + "node.key", d + "ca.pem");
  // An intermediate CA alone is a trust anchor, as gRPC's own store takes it.
  CHECK(error_of(d + "inode.pem", d + "inode.key", d + "int.pem").empty());
  CHECK(contains(f.cert, "BEGIN CERTIFICATE"));
  CHECK(contains(f.key, "PRIVATE KEY"));
  CHECK(error_of(d + "node.pem", d + "node.key", d + "ca.pem").empty());
  struct Case {
    std::string cert, key, ca, want;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"cfg.yaml", "node.key", "ca.pem",
            "distributed.tls.cert: '" + d + "cfg.yaml' holds no PEM certificate"},
           {"node.key", "node.pem", "ca.pem", "distributed.tls.cert: '" + d + "node.key' holds no"},
           {"node.pem", "node.pem", "ca.pem",
            "distributed.tls.key: '" + d + "node.pem' holds no PEM"},
           {"node.pem", "other.key", "ca.pem", "is not the private key of the certificate"},
           {"node.pem", "enc.key", "ca.pem", "is an encrypted private key"},
           {"node.pem", "node.key", "cfg.yaml", "distributed.tls.ca: '" + d + "cfg.yaml' holds no"},
           {"node.pem", "node.key", "ca2.pem", "does not verify against the CA"},
           {"node.pem", "node.key", "missing.pem", "distributed.tls.ca: "},
           {"srv.pem", "srv.key", "ca.pem",
            "does not verify against the CA '" + d + "ca.pem' as a TLS client"}}) {
    const std::string e = error_of(d + c.cert, d + c.key, d + c.ca);
    INFO(c.cert << " " << c.key << " " << c.ca << ": " << e);
    CHECK(contains(e, c.want));
  }
}

TEST_CASE("TLS names: the host ranks dial must be in the certificate, else it says which it has") {
  // A certificate without the address ranks dial failed every handshake, which the ranks saw
  // only as a rendezvous timeout (the cause was in gRPC's debug log alone).
  dtrain::testing::TempDir dir;
  const std::string d = dir.path() + "/";
  const std::string cmd =
      "cd " + d +
      " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
      " -keyout n.key -out san.pem -days 2 -subj /CN=ignored"
      " -addext subjectAltName=DNS:other.example,IP:10.0.0.2"
      " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
      " -keyout m.key -out cn.pem -days 2 -subj /CN=node0 2>&1";
  if (dtrain::testing::run_cmd(cmd).exit_code != 0) {
    MESSAGE("skipped: cannot make test certificates with openssl");
    return;
  }
  const std::string san = dtrain::testing::read_text(d + "san.pem");
  const std::string cn = dtrain::testing::read_text(d + "cn.pem");
  CHECK(tls_name_problem(san, "other.example").empty());
  CHECK(tls_name_problem(san, "10.0.0.2").empty());
  const std::string why = tls_name_problem(san, "127.0.0.1");
  CHECK_MESSAGE(contains(why, "does not name the address 127.0.0.1"), why);
  CHECK_MESSAGE(contains(why, "its names: DNS:other.example, IP:10.0.0.2"), why);
  CHECK_MESSAGE(contains(why, "add IP:127.0.0.1 to its subjectAltName"), why);
  CHECK(contains(tls_name_problem(san, "node0"), "does not name the host node0"));
  // Without subjectAltNames the common name is the host name, as gRPC checks it.
  CHECK(tls_name_problem(cn, "node0").empty());
  CHECK(contains(tls_name_problem(cn, "[::1]"), "it has no subjectAltName"));
}
