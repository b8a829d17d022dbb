#include "common/credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/tokens.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace ddp {
namespace {

// Certificates and keys are a few kilobytes; a chain file a few dozen.
constexpr size_t kMaxPemBytes = 1 << 20;

std::string Where(const std::string& flag, const std::string& path) {
  return absl::StrCat(flag, "=", path, ": ");
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(Where(flag, path) + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(Where(flag, path) + "not a file");
  if (static_cast<size_t>(st.st_size) > kMaxPemBytes) {
    return absl::InvalidArgumentError(Where(flag, path) + "larger than 1 MiB; not a PEM file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(Where(flag, path) + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate in `pem`, or null.
X509Ptr FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return cert;
}

KeyPtr PrivateKey(const std::string& pem) {
  auto bio = MemoryBio(pem);
  // An empty passphrase callback: an encrypted key fails here instead of
  // prompting on a terminal a daemon doesn't have.
  KeyPtr key(PEM_read_bio_PrivateKey(
      bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  ERR_clear_error();
  return key;
}

// The PEM files of a certificate and its key, checked to belong together.
struct KeyPair {
  std::string cert_pem;
  std::string key_pem;
};

absl::StatusOr<KeyPair> LoadKeyPair(const TlsFlags& flags, const char* cert_flag,
                                    const char* key_flag) {
  if (flags.cert.empty() != flags.key.empty()) {
    return absl::InvalidArgumentError(
        flags.cert.empty() ? absl::StrCat(key_flag, "=", flags.key, " needs ", cert_flag,
                                          " (the certificate of that key)")
                           : absl::StrCat(cert_flag, "=", flags.cert, " needs ", key_flag,
                                          " (the certificate's private key)"));
  }
  KeyPair pair;
  absl::StatusOr<std::string> cert = ReadPem(cert_flag, flags.cert);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(key_flag, flags.key);
  if (!key.ok()) return key.status();
  X509Ptr x509 = FirstCertificate(*cert);
  if (!x509) {
    return absl::InvalidArgumentError(Where(cert_flag, flags.cert) +
                                      "no PEM certificate (-----BEGIN CERTIFICATE-----) in it");
  }
  KeyPtr pkey = PrivateKey(*key);
  if (!pkey) {
    return absl::InvalidArgumentError(
        Where(key_flag, flags.key) +
        "no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----) in it");
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(Where(key_flag, flags.key),
                                                   "is not the key of the certificate in ",
                                                   cert_flag, "=", flags.cert));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(x509.get())) < 0) {
    DDP_LOG(Warning) << Where(cert_flag, flags.cert)
                     << "the certificate has expired; peers will refuse it";
  }
  pair.cert_pem = std::move(*cert);
  pair.key_pem = std::move(*key);
  return pair;
}

absl::StatusOr<std::string> LoadCa(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> ca = ReadPem(flag, path);
  if (!ca.ok()) return ca.status();
  if (!FirstCertificate(*ca)) {
    return absl::InvalidArgumentError(Where(flag, path) +
                                      "no PEM certificate (-----BEGIN CERTIFICATE-----) in it");
  }
  return ca;
}

// Adds "authorization: Bearer <token>" to every call's initial metadata.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(std::string value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationMetadata, value_);
    }
    methods->Proceed();
  }

 private:
  const std::string value_;
};

class BearerInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token)
      : value_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerInterceptor(value_);
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFlags& flags) {
  if (!flags.any()) return grpc::InsecureServerCredentials();
  if (flags.cert.empty() && flags.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_ca=", flags.ca,
        " needs --tls_cert and --tls_key: client certificates are checked only over TLS"));
  }
  absl::StatusOr<KeyPair> pair = LoadKeyPair(flags, "--tls_cert", "--tls_key");
  if (!pair.ok()) return pair.status();
  grpc::SslServerCredentialsOptions options(
      flags.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                       : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!flags.ca.empty()) {
    absl::StatusOr<std::string> ca = LoadCa("--tls_ca", flags.ca);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = std::move(*ca);
  }
  options.pem_key_cert_pairs.push_back({std::move(pair->key_pem), std::move(pair->cert_pem)});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<ClientSecurity> LoadClientSecurity(const TlsFlags& flags,
                                                  const std::string& token_file) {
  ClientSecurity security;
  if (flags.any()) {
    security.tls = true;
    if (!flags.cert.empty() || !flags.key.empty()) {
      absl::StatusOr<KeyPair> pair = LoadKeyPair(flags, "--tls_cert", "--tls_key");
      if (!pair.ok()) return pair.status();
      security.cert_pem = std::move(pair->cert_pem);
      security.key_pem = std::move(pair->key_pem);
    }
    if (!flags.ca.empty()) {
      absl::StatusOr<std::string> ca = LoadCa("--tls_ca", flags.ca);
      if (!ca.ok()) return ca.status();
      security.ca_pem = std::move(*ca);
    }
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = LoadTokenFile("--token_file", token_file);
    if (!token.ok()) return token.status();
    security.token = std::move(*token);
  }
  return security;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientSecurity& security,
                                           const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (security.tls) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = security.ca_pem;
    options.pem_private_key = security.key_pem;
    options.pem_cert_chain = security.cert_pem;
    credentials = grpc::SslCredentials(options);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  if (security.token.empty()) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<BearerInterceptorFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(factories));
}

}  // namespace ddp
