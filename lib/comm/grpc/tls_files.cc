#include "comm/grpc/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>

#include "util/check.h"
#include "util/fs.h"

namespace dtrain {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using X509Store = std::unique_ptr<X509_STORE, Deleter<X509_STORE, X509_STORE_free>>;
using StoreCtx = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

Bio mem_bio(const std::string& text) {
  return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// A TLS file's text (at most 1 MiB: a certificate chain is a few KiB).
std::string read_tls(const std::string& path, const std::string& key) {
  try {
    return read_regular_file(path, 1 << 20);
  } catch (const UserError& e) {
    throw UserError(key + ": " + e.what());
  }
}

// An encrypted key would make OpenSSL ask for its passphrase on the terminal: refused instead.
int no_passphrase(char*, int, int, void*) {
  return -1;
}

}  // namespace

TlsFiles read_tls_files(const std::string& cert, const std::string& key, const std::string& ca,
                        const std::string& keys) {
  TlsFiles f{read_tls(cert, keys + ".cert"), read_tls(key, keys + ".key"),
             read_tls(ca, keys + ".ca")};
  ERR_clear_error();
  const auto bad = [&](const std::string& k, const std::string& path, const std::string& why) {
    ERR_clear_error();
    return UserError(keys + "." + k + ": '" + path + "' " + why);
  };
  Bio cb = mem_bio(f.cert);
  const X509Ptr c(PEM_read_bio_X509(cb.get(), nullptr, no_passphrase, nullptr));
  if (!c) throw bad("cert", cert, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
  Bio kb = mem_bio(f.key);
  const KeyPtr k(PEM_read_bio_PrivateKey(kb.get(), nullptr, no_passphrase, nullptr));
  if (!k)
    throw bad("key", key,
              f.key.find("ENCRYPTED") != std::string::npos
                  ? "is an encrypted private key: give it without a passphrase (openssl pkey -in "
                    "KEY -out KEY.plain), readable only by the job's user"
                  : "holds no PEM private key (-----BEGIN PRIVATE KEY-----)");
  if (X509_check_private_key(c.get(), k.get()) != 1)
    throw bad("key", key, "is not the private key of the certificate '" + cert + "'");
  const X509Store store(X509_STORE_new());
  DT_CHECK(store != nullptr);
  // As gRPC's own store (ssl_ctx_load_verification_certs): an intermediate CA given alone is a
  // trust anchor too.
  X509_STORE_set_flags(store.get(), X509_V_FLAG_PARTIAL_CHAIN | X509_V_FLAG_TRUSTED_FIRST);
  Bio ab = mem_bio(f.ca);
  int cas = 0;
  while (X509* a = PEM_read_bio_X509(ab.get(), nullptr, no_passphrase, nullptr)) {
    X509_STORE_add_cert(store.get(), a);  // (takes its own reference)
    X509_free(a);
    ++cas;
  }
  if (cas == 0) throw bad("ca", ca, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
  // The certificate against the CA, with the chain the cert file carries after it, for both
  // roles a rank plays: the server its peers connect to and the client of theirs (an extended
  // key usage that allows only one fails the other side's handshake).
  const auto free_chain = [](STACK_OF(X509) * c) { sk_X509_pop_free(c, X509_free); };
  const std::unique_ptr<STACK_OF(X509), decltype(free_chain)> chain(sk_X509_new_null(), free_chain);
  DT_CHECK(chain != nullptr);
  while (X509* i = PEM_read_bio_X509(cb.get(), nullptr, no_passphrase, nullptr))
    if (sk_X509_push(chain.get(), i) == 0) X509_free(i);
  for (const int purpose : {X509_PURPOSE_SSL_SERVER, X509_PURPOSE_SSL_CLIENT}) {
    const StoreCtx ctx(X509_STORE_CTX_new());
    DT_CHECK(ctx != nullptr);
    if (X509_STORE_CTX_init(ctx.get(), store.get(), c.get(), chain.get()) != 1)
      throw bad("cert", cert, "could not be checked against the CA '" + ca + "' (OpenSSL)");
    X509_STORE_CTX_set_purpose(ctx.get(), purpose);
    if (X509_verify_cert(ctx.get()) != 1)
      throw bad("cert", cert,
                std::string("does not verify against the CA '") + ca + "' as a TLS " +
                    (purpose == X509_PURPOSE_SSL_SERVER ? "server" : "client") + ": " +
                    X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())) +
                    " (every rank is both, and checks its peers' certificates against that CA)");
  }
  ERR_clear_error();
  return f;
}

std::string tls_name_problem(const std::string& cert_pem, const std::string& host_in) {
  std::string host = host_in;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);  // an IPv6 literal as URIs bracket it
  Bio b = mem_bio(cert_pem);
  const X509Ptr c(PEM_read_bio_X509(b.get(), nullptr, no_passphrase, nullptr));
  ERR_clear_error();
  if (!c) return "";  // (read_tls_files refuses it, naming the file)
  using Names = std::unique_ptr<GENERAL_NAMES, Deleter<GENERAL_NAMES, GENERAL_NAMES_free>>;
  const Names sans(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(c.get(), NID_subject_alt_name, nullptr, nullptr)));
  // gRPC falls back to the common name only for a certificate without any subjectAltName
  // (OpenSSL's default also does for one with IP names only).
  const unsigned flags =
      sans && sk_GENERAL_NAME_num(sans.get()) > 0 ? X509_CHECK_FLAG_NEVER_CHECK_SUBJECT : 0;
  const bool ip = X509_check_ip_asc(c.get(), host.c_str(), 0) != -2;  // -2: not an address
  const int match = ip ? X509_check_ip_asc(c.get(), host.c_str(), 0)
                       : X509_check_host(c.get(), host.data(), host.size(), flags, nullptr);
  ERR_clear_error();
  if (match == 1) return "";
  std::string names;
  for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans.get()); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(sans.get(), i);
    std::string one;
    if (n->type == GEN_DNS) {
      const ASN1_STRING* s = n->d.dNSName;
      one = "DNS:" + std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                                 static_cast<size_t>(ASN1_STRING_length(s)));
    } else if (n->type == GEN_IPADD) {
      const ASN1_STRING* s = n->d.iPAddress;
      char text[64] = {};
      const int len = ASN1_STRING_length(s);
      const unsigned char* d = ASN1_STRING_get0_data(s);
      if (len == 4)
        std::snprintf(text, sizeof text, "%d.%d.%d.%d", d[0], d[1], d[2], d[3]);
      else
        std::snprintf(text, sizeof text, "(an IPv6 address)");
      one = std::string("IP:") + text;
    }
    if (!one.empty()) names += (names.empty() ? "" : ", ") + one;
  }
  ERR_clear_error();
  return "does not name " + std::string(ip ? "the address " : "the host ") + host +
         ", which ranks dial and check it against (" +
         (names.empty() ? std::string("it has no subjectAltName") : "its names: " + names) +
         "): add " + (ip ? "IP:" : "DNS:") + host + " to its subjectAltName";
}

}  // namespace dtrain
