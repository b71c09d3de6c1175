// OpenSSL (libcrypto and libssl), loaded on first use (common/lazy_lib.h) instead of at every
// start of sbx.
//
// Linked the usual way, libcrypto.so.3 and libssl.so.3 are loaded and relocated by every `sbx`
// invocation: about 24,000 relocations, 0.85 ms here (an empty C program linked with -lssl
// -lcrypto starts in 1.9 ms, without them in 1.1 ms). Only TLS (the registry client, the egress
// proxy's interception, ingress), hashes of layers and API keys, the secret store's cipher and
// the network CA use OpenSSL; `sbx run` without a network and the client verbs use none of it.
// So nothing links -lssl or -lcrypto: the functions below have the names and prototypes of
// OpenSSL's headers and forward to the real ones, looked up the first time any of them is called.
// The libraries stay those of the system, with its security updates (a static OpenSSL would
// not).
//
// The list must cover every OpenSSL function the code calls, including those Boost.Asio's and
// Beast's SSL streams call and those OpenSSL's macros expand to. One that is missing fails the
// link with an undefined reference: add it here. A prototype that differs from the header's does
// not compile. Variadic functions cannot be forwarded: network/ca.cc generates its keys without
// EVP_EC_gen's EVP_PKEY_Q_keygen for that reason.
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include "common/lazy_lib.h"

namespace {
// libssl.so.3 needs libcrypto.so.3, so either opening first is fine.
constexpr char kLibcrypto[] = "libcrypto.so.3";
constexpr char kLibssl[] = "libssl.so.3";
}  // namespace

#define SBX_LAZY_CRYPTO(ret, name, params, args) SBX_LAZY_FROM(kLibcrypto, ret, name, params, args)
#define SBX_LAZY_SSL(ret, name, params, args) SBX_LAZY_FROM(kLibssl, ret, name, params, args)

// clang-format reads the parameter lists as expressions (`BIO * a`).
// clang-format off
// libcrypto.so.3
SBX_LAZY_CRYPTO(long, BIO_ctrl, (BIO* bp, int cmd, long larg, void* parg), (bp, cmd, larg, parg))
SBX_LAZY_CRYPTO(size_t, BIO_ctrl_pending, (BIO* b), (b))
SBX_LAZY_CRYPTO(int, BIO_free, (BIO* a), (a))
SBX_LAZY_CRYPTO(BIO*, BIO_new, (const BIO_METHOD* type), (type))
SBX_LAZY_CRYPTO(int, BIO_new_bio_pair, (BIO** bio1, size_t writebuf1, BIO** bio2, size_t writebuf2),
                (bio1, writebuf1, bio2, writebuf2))
SBX_LAZY_CRYPTO(BIO*, BIO_new_mem_buf, (const void* buf, int len), (buf, len))
SBX_LAZY_CRYPTO(int, BIO_read, (BIO* b, void* data, int dlen), (b, data, dlen))
SBX_LAZY_CRYPTO(const BIO_METHOD*, BIO_s_mem, (), ())
SBX_LAZY_CRYPTO(int, BIO_write, (BIO* b, const void* data, int dlen), (b, data, dlen))
SBX_LAZY_CRYPTO(BIGNUM*, BN_bin2bn, (const unsigned char* s, int len, BIGNUM* ret), (s, len, ret))
SBX_LAZY_CRYPTO(void, BN_free, (BIGNUM* a), (a))
SBX_LAZY_CRYPTO(ASN1_INTEGER*, BN_to_ASN1_INTEGER, (const BIGNUM* bn, ASN1_INTEGER* ai), (bn, ai))
SBX_LAZY_CRYPTO(int, CRYPTO_memcmp, (const void* in_a, const void* in_b, size_t len),
                (in_a, in_b, len))
SBX_LAZY_CRYPTO(void, ERR_clear_error, (), ())
SBX_LAZY_CRYPTO(void, ERR_error_string_n, (unsigned long e, char* buf, size_t len), (e, buf, len))
SBX_LAZY_CRYPTO(unsigned long, ERR_get_error, (), ())
SBX_LAZY_CRYPTO(const char*, ERR_reason_error_string, (unsigned long e), (e))
SBX_LAZY_CRYPTO(int, EVP_CIPHER_CTX_ctrl, (EVP_CIPHER_CTX* ctx, int type, int arg, void* ptr),
                (ctx, type, arg, ptr))
SBX_LAZY_CRYPTO(void, EVP_CIPHER_CTX_free, (EVP_CIPHER_CTX* c), (c))
SBX_LAZY_CRYPTO(EVP_CIPHER_CTX*, EVP_CIPHER_CTX_new, (), ())
SBX_LAZY_CRYPTO(int, EVP_DecodeBlock, (unsigned char* t, const unsigned char* f, int n), (t, f, n))
SBX_LAZY_CRYPTO(int, EVP_DecryptFinal_ex, (EVP_CIPHER_CTX* ctx, unsigned char* outm, int* outl),
                (ctx, outm, outl))
SBX_LAZY_CRYPTO(int, EVP_DecryptInit_ex, (EVP_CIPHER_CTX* ctx, const EVP_CIPHER* cipher,
                ENGINE* impl, const unsigned char* key, const unsigned char* iv),
                (ctx, cipher, impl, key, iv))
SBX_LAZY_CRYPTO(int, EVP_DecryptUpdate, (EVP_CIPHER_CTX* ctx, unsigned char* out, int* outl,
                const unsigned char* in, int inl), (ctx, out, outl, in, inl))
SBX_LAZY_CRYPTO(int, EVP_Digest, (const void* data, size_t count, unsigned char* md,
                unsigned int* size, const EVP_MD* type, ENGINE* impl),
                (data, count, md, size, type, impl))
SBX_LAZY_CRYPTO(int, EVP_DigestFinal_ex, (EVP_MD_CTX* ctx, unsigned char* md, unsigned int* s),
                (ctx, md, s))
SBX_LAZY_CRYPTO(int, EVP_DigestInit_ex, (EVP_MD_CTX* ctx, const EVP_MD* type, ENGINE* impl),
                (ctx, type, impl))
SBX_LAZY_CRYPTO(int, EVP_DigestUpdate, (EVP_MD_CTX* ctx, const void* d, size_t cnt), (ctx, d, cnt))
SBX_LAZY_CRYPTO(int, EVP_EncodeBlock, (unsigned char* t, const unsigned char* f, int n), (t, f, n))
SBX_LAZY_CRYPTO(int, EVP_EncryptFinal_ex, (EVP_CIPHER_CTX* ctx, unsigned char* out, int* outl),
                (ctx, out, outl))
SBX_LAZY_CRYPTO(int, EVP_EncryptInit_ex, (EVP_CIPHER_CTX* ctx, const EVP_CIPHER* cipher,
                ENGINE* impl, const unsigned char* key, const unsigned char* iv),
                (ctx, cipher, impl, key, iv))
SBX_LAZY_CRYPTO(int, EVP_EncryptUpdate, (EVP_CIPHER_CTX* ctx, unsigned char* out, int* outl,
                const unsigned char* in, int inl), (ctx, out, outl, in, inl))
SBX_LAZY_CRYPTO(void, EVP_MD_CTX_free, (EVP_MD_CTX* ctx), (ctx))
SBX_LAZY_CRYPTO(EVP_MD_CTX*, EVP_MD_CTX_new, (), ())
SBX_LAZY_CRYPTO(void, EVP_PKEY_CTX_free, (EVP_PKEY_CTX* ctx), (ctx))
SBX_LAZY_CRYPTO(EVP_PKEY_CTX*, EVP_PKEY_CTX_new_from_name, (OSSL_LIB_CTX* libctx, const char* name,
                const char* propquery), (libctx, name, propquery))
SBX_LAZY_CRYPTO(int, EVP_PKEY_CTX_set_group_name, (EVP_PKEY_CTX* ctx, const char* name),
                (ctx, name))
SBX_LAZY_CRYPTO(void, EVP_PKEY_free, (EVP_PKEY* pkey), (pkey))
SBX_LAZY_CRYPTO(int, EVP_PKEY_generate, (EVP_PKEY_CTX* ctx, EVP_PKEY** ppkey), (ctx, ppkey))
SBX_LAZY_CRYPTO(int, EVP_PKEY_keygen_init, (EVP_PKEY_CTX* ctx), (ctx))
SBX_LAZY_CRYPTO(int, EVP_PKEY_up_ref, (EVP_PKEY* pkey), (pkey))
SBX_LAZY_CRYPTO(const EVP_CIPHER*, EVP_aes_256_gcm, (), ())
SBX_LAZY_CRYPTO(const EVP_MD*, EVP_sha256, (), ())
SBX_LAZY_CRYPTO(unsigned char*, HMAC, (const EVP_MD* evp_md, const void* key, int key_len,
                const unsigned char* data, size_t data_len, unsigned char* md,
                unsigned int* md_len), (evp_md, key, key_len, data, data_len, md, md_len))
SBX_LAZY_CRYPTO(void, OPENSSL_cleanse, (void* ptr, size_t len), (ptr, len))
SBX_LAZY_CRYPTO(EVP_PKEY*, PEM_read_bio_PrivateKey, (BIO* out, EVP_PKEY** x, pem_password_cb* cb,
                void* u), (out, x, cb, u))
SBX_LAZY_CRYPTO(X509*, PEM_read_bio_X509, (BIO* out, X509** x, pem_password_cb* cb, void* u),
                (out, x, cb, u))
SBX_LAZY_CRYPTO(int, PEM_write_bio_PrivateKey, (BIO* out, const EVP_PKEY* x, const EVP_CIPHER* enc,
                const unsigned char* kstr, int klen, pem_password_cb* cb, void* u),
                (out, x, enc, kstr, klen, cb, u))
SBX_LAZY_CRYPTO(int, PEM_write_bio_X509, (BIO* out, const X509* x), (out, x))
SBX_LAZY_CRYPTO(int, RAND_bytes, (unsigned char* buf, int num), (buf, num))
SBX_LAZY_CRYPTO(X509_EXTENSION*, X509V3_EXT_conf_nid, (lhash_st_CONF_VALUE* conf, X509V3_CTX* ctx,
                int ext_nid, const char* value), (conf, ctx, ext_nid, value))
SBX_LAZY_CRYPTO(void, X509V3_set_ctx, (X509V3_CTX* ctx, X509* issuer, X509* subject, X509_REQ* req,
                X509_CRL* crl, int flags), (ctx, issuer, subject, req, crl, flags))
SBX_LAZY_CRYPTO(void, X509_EXTENSION_free, (X509_EXTENSION* a), (a))
SBX_LAZY_CRYPTO(int, X509_NAME_add_entry_by_txt, (X509_NAME* name, const char* field, int type,
                const unsigned char* bytes, int len, int loc, int set),
                (name, field, type, bytes, len, loc, set))
SBX_LAZY_CRYPTO(int, X509_VERIFY_PARAM_set1_host, (X509_VERIFY_PARAM* param, const char* name,
                size_t namelen), (param, name, namelen))
SBX_LAZY_CRYPTO(int, X509_VERIFY_PARAM_set1_ip_asc, (X509_VERIFY_PARAM* param, const char* ipasc),
                (param, ipasc))
SBX_LAZY_CRYPTO(void, X509_VERIFY_PARAM_set_hostflags, (X509_VERIFY_PARAM* param,
                unsigned int flags), (param, flags))
SBX_LAZY_CRYPTO(int, X509_add_ext, (X509* x, X509_EXTENSION* ex, int loc), (x, ex, loc))
SBX_LAZY_CRYPTO(int, X509_check_ca, (X509* x), (x))
SBX_LAZY_CRYPTO(int, X509_check_private_key, (const X509* x509, const EVP_PKEY* pkey), (x509, pkey))
SBX_LAZY_CRYPTO(void, X509_free, (X509* a), (a))
SBX_LAZY_CRYPTO(ASN1_INTEGER*, X509_get_serialNumber, (X509* x), (x))
SBX_LAZY_CRYPTO(X509_NAME*, X509_get_subject_name, (const X509* a), (a))
SBX_LAZY_CRYPTO(ASN1_TIME*, X509_getm_notAfter, (const X509* x), (x))
SBX_LAZY_CRYPTO(ASN1_TIME*, X509_getm_notBefore, (const X509* x), (x))
SBX_LAZY_CRYPTO(ASN1_TIME*, X509_gmtime_adj, (ASN1_TIME* s, long adj), (s, adj))
SBX_LAZY_CRYPTO(X509*, X509_new, (), ())
SBX_LAZY_CRYPTO(int, X509_set_issuer_name, (X509* x, const X509_NAME* name), (x, name))
SBX_LAZY_CRYPTO(int, X509_set_pubkey, (X509* x, EVP_PKEY* pkey), (x, pkey))
SBX_LAZY_CRYPTO(int, X509_set_version, (X509* x, long version), (x, version))
SBX_LAZY_CRYPTO(int, X509_sign, (X509* x, EVP_PKEY* pkey, const EVP_MD* md), (x, pkey, md))
SBX_LAZY_CRYPTO(const char*, X509_verify_cert_error_string, (long n), (n))
// libssl.so.3
SBX_LAZY_SSL(long, SSL_CTX_ctrl, (SSL_CTX* ctx, int cmd, long larg, void* parg),
             (ctx, cmd, larg, parg))
SBX_LAZY_SSL(void, SSL_CTX_free, (SSL_CTX* ctx), (ctx))
SBX_LAZY_SSL(void*, SSL_CTX_get_default_passwd_cb_userdata, (SSL_CTX* ctx), (ctx))
SBX_LAZY_SSL(void*, SSL_CTX_get_ex_data, (const SSL_CTX* ssl, int idx), (ssl, idx))
SBX_LAZY_SSL(SSL_verify_cb, SSL_CTX_get_verify_callback, (const SSL_CTX* ctx), (ctx))
SBX_LAZY_SSL(int, SSL_CTX_load_verify_locations, (SSL_CTX* ctx, const char* CAfile,
             const char* CApath), (ctx, CAfile, CApath))
SBX_LAZY_SSL(SSL_CTX*, SSL_CTX_new, (const SSL_METHOD* meth), (meth))
SBX_LAZY_SSL(int, SSL_CTX_set_alpn_protos, (SSL_CTX* ctx, const unsigned char* protos,
             unsigned int protos_len), (ctx, protos, protos_len))
SBX_LAZY_SSL(void, SSL_CTX_set_alpn_select_cb, (SSL_CTX* ctx, SSL_CTX_alpn_select_cb_func cb,
             void* arg), (ctx, cb, arg))
SBX_LAZY_SSL(void, SSL_CTX_set_default_passwd_cb_userdata, (SSL_CTX* ctx, void* u), (ctx, u))
SBX_LAZY_SSL(int, SSL_CTX_set_default_verify_paths, (SSL_CTX* ctx), (ctx))
SBX_LAZY_SSL(int, SSL_CTX_set_ex_data, (SSL_CTX* ssl, int idx, void* data), (ssl, idx, data))
SBX_LAZY_SSL(int, SSL_CTX_set_num_tickets, (SSL_CTX* ctx, size_t num_tickets), (ctx, num_tickets))
SBX_LAZY_SSL(uint64_t, SSL_CTX_set_options, (SSL_CTX* ctx, uint64_t op), (ctx, op))
SBX_LAZY_SSL(void, SSL_CTX_set_verify, (SSL_CTX* ctx, int mode, SSL_verify_cb callback),
             (ctx, mode, callback))
SBX_LAZY_SSL(int, SSL_accept, (SSL* ssl), (ssl))
SBX_LAZY_SSL(int, SSL_connect, (SSL* ssl), (ssl))
SBX_LAZY_SSL(long, SSL_ctrl, (SSL* ssl, int cmd, long larg, void* parg), (ssl, cmd, larg, parg))
SBX_LAZY_SSL(int, SSL_do_handshake, (SSL* s), (s))
SBX_LAZY_SSL(void, SSL_free, (SSL* ssl), (ssl))
SBX_LAZY_SSL(X509_VERIFY_PARAM*, SSL_get0_param, (SSL* ssl), (ssl))
SBX_LAZY_SSL(int, SSL_get_error, (const SSL* s, int ret_code), (s, ret_code))
SBX_LAZY_SSL(void*, SSL_get_ex_data, (const SSL* ssl, int idx), (ssl, idx))
SBX_LAZY_SSL(int, SSL_get_shutdown, (const SSL* ssl), (ssl))
SBX_LAZY_SSL(long, SSL_get_verify_result, (const SSL* ssl), (ssl))
SBX_LAZY_SSL(SSL*, SSL_new, (SSL_CTX* ctx), (ctx))
SBX_LAZY_SSL(int, SSL_read, (SSL* ssl, void* buf, int num), (ssl, buf, num))
SBX_LAZY_SSL(int, SSL_select_next_proto, (unsigned char** out, unsigned char* outlen,
             const unsigned char* in, unsigned int inlen, const unsigned char* client,
             unsigned int client_len), (out, outlen, in, inlen, client, client_len))
SBX_LAZY_SSL(void, SSL_set_accept_state, (SSL* s), (s))
SBX_LAZY_SSL(void, SSL_set_bio, (SSL* s, BIO* rbio, BIO* wbio), (s, rbio, wbio))
SBX_LAZY_SSL(int, SSL_set_ex_data, (SSL* ssl, int idx, void* data), (ssl, idx, data))
SBX_LAZY_SSL(int, SSL_shutdown, (SSL* s), (s))
SBX_LAZY_SSL(int, SSL_use_PrivateKey, (SSL* ssl, EVP_PKEY* pkey), (ssl, pkey))
SBX_LAZY_SSL(int, SSL_use_certificate, (SSL* ssl, X509* x), (ssl, x))
SBX_LAZY_SSL(int, SSL_write, (SSL* ssl, const void* buf, int num), (ssl, buf, num))
SBX_LAZY_SSL(const SSL_METHOD*, TLS_client_method, (), ())
SBX_LAZY_SSL(const SSL_METHOD*, TLS_server_method, (), ())
// clang-format on

#undef SBX_LAZY_CRYPTO
#undef SBX_LAZY_SSL
