// storage::PullImage (src/storage/registry.h) against real registries on loopback: Debian's
// docker-registry (the distribution registry), started by each test with its own config and
// storage, images pushed into it with skopeo; and tests/registry/fake_registry.py for what a real
// registry will not do (tampered and oversized blobs, oversized manifests, dropped connections,
// bearer tokens, redirects). Every image is made here: an OCI layout of gzip'd tar layers written
// with libarchive. Only 127.0.0.1 is ever contacted. Also builds FROM a registry image: `sbx
// build`, and the daemon's E2B builds under its registry policy (mirror, allowlist, redirects to
// unlisted loopback, credentials per key).
#include "storage/registry.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/http/client.h"
#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "daemon_process.h"
#include "sbx_process.h"
#include "store/store.h"

extern char** environ;

namespace sbx::storage {
namespace {

using nlohmann::json;
using test::ProcessOptions;
using test::RunProcess;

struct TempDir {
  TempDir() {
    std::string tmpl = "/tmp/sbx-registry-test-" + std::to_string(::getpid()) + "-XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { (void)RemoveTree(path); }  // a test's leftovers; nothing to do on failure
  std::string path;
};

// A server process: started with stdout/stderr to `log`, SIGTERM'd (then SIGKILL'd) and reaped
// when it goes out of scope.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (::posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Child() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 500; ++i) {  // bounded: 5 s, then SIGKILL
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  bool Running() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }
  // SIGKILL now, and reap: a process killed at an arbitrary instant.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// Polls `ready` every 10 ms for at most 30 s (a bounded poll of a condition, not a sleep).
template <typename F>
bool WaitFor(F ready) {
  for (int i = 0; i < 3000; ++i) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool Listening(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}

int FreePort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  return ntohs(a.sin_port);
}

std::string Slurp(const std::string& path) {
  auto r = ReadFile(path);
  return r.ok() ? *r : "";
}

void Write(const std::string& path, const std::string& data) {
  ASSERT_TRUE(WriteFile(path, data, 0600).ok()) << path;
}

// ---- images ----

// A tar of `files` (name -> content), gzip'd or not.
std::string Tar(const std::vector<std::pair<std::string, std::string>>& files, bool gzip) {
  std::string out;
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (gzip) archive_write_add_filter_gzip(a);
  archive_write_set_bytes_in_last_block(a, 1);
  archive_write_open(
      a, &out, nullptr,
      [](archive*, void* p, const void* buf, size_t n) -> la_ssize_t {
        static_cast<std::string*>(p)->append(static_cast<const char*>(buf), n);
        return static_cast<la_ssize_t>(n);
      },
      nullptr);
  for (const auto& [name, content] : files) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, name.rfind("bin/", 0) == 0 ? 0755 : 0644);
    archive_entry_set_size(e, static_cast<la_int64_t>(content.size()));
    archive_entry_set_mtime(e, 1700000000, 0);
    archive_write_header(a, e);
    archive_write_data(a, content.data(), content.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

// Bytes no compressor shrinks (xorshift), so a layer is as large on the wire as asked.
std::string Noise(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x);
  }
  return s;
}

struct Blob {
  std::string digest;
  int64_t size = 0;
};

// An OCI image layout being written.
class Layout {
 public:
  explicit Layout(std::string dir) : dir_(std::move(dir)) {
    EXPECT_TRUE(MakeDirs(dir_ + "/blobs/sha256", 0700).ok());
    Write(dir_ + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  }
  const std::string& dir() const { return dir_; }

  Blob Add(const std::string& data) {
    Blob b{"sha256:" + store::Sha256Hex(data), static_cast<int64_t>(data.size())};
    Write(dir_ + "/blobs/sha256/" + b.digest.substr(7), data);
    return b;
  }

  // An image manifest of one layer per element of `layers` (files of it), for `arch`.
  struct Image {
    Blob manifest, config;
    std::vector<Blob> layers;
  };
  Image AddImage(const std::vector<std::vector<std::pair<std::string, std::string>>>& layers,
                 const std::string& arch = "amd64") {
    Image img;
    json diff_ids = json::array(), descs = json::array();
    for (const auto& files : layers) {
      diff_ids.push_back("sha256:" + store::Sha256Hex(Tar(files, false)));
      Blob l = Add(Tar(files, true));
      img.layers.push_back(l);
      descs.push_back({{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
                       {"digest", l.digest},
                       {"size", l.size}});
    }
    json config = {{"architecture", arch},
                   {"os", "linux"},
                   {"config", {{"Env", {"PATH=/usr/bin:/bin", "FROM_TEST=1"}}}},
                   {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
    img.config = Add(config.dump());
    json manifest = {{"schemaVersion", 2},
                     {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                     {"config",
                      {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                       {"digest", img.config.digest},
                       {"size", img.config.size}}},
                     {"layers", descs}};
    img.manifest = Add(manifest.dump());
    return img;
  }

  Blob AddIndex(const std::vector<std::pair<Image, std::string>>& images) {
    json ms = json::array();
    for (const auto& [img, arch] : images)
      ms.push_back({{"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                    {"digest", img.manifest.digest},
                    {"size", img.manifest.size},
                    {"platform", {{"os", "linux"}, {"architecture", arch}}}});
    json index = {{"schemaVersion", 2},
                  {"mediaType", "application/vnd.oci.image.index.v1+json"},
                  {"manifests", ms}};
    return Add(index.dump());
  }

  // Names `b` (a manifest or an index) `tag` in index.json.
  void Tag(const Blob& b, const std::string& tag, bool is_index = false) {
    entries_.push_back({{"mediaType", is_index ? "application/vnd.oci.image.index.v1+json"
                                               : "application/vnd.oci.image.manifest.v1+json"},
                        {"digest", b.digest},
                        {"size", b.size},
                        {"annotations", {{"org.opencontainers.image.ref.name", tag}}}});
    json index = {{"schemaVersion", 2}, {"manifests", entries_}};
    Write(dir_ + "/index.json", index.dump());
  }

 private:
  std::string dir_;
  json entries_ = json::array();
};

// A small image of two layers, the second big enough (1 MiB) to be cut in the middle.
Layout::Image SmallImage(Layout& layout) {
  return layout.AddImage({{{"etc/hello", "hello from layer 1\n"}},
                          {{"data/noise", Noise(1 << 20, 7)}, {"etc/two", "2\n"}}});
}

// ---- registries ----

// Debian's docker-registry on 127.0.0.1:<port>, storage in its own directory; with `tls` (cert
// and key) and `htpasswd` (a file) when given.
class RealRegistry {
 public:
  explicit RealRegistry(const std::string& tls_cert = "", const std::string& tls_key = "",
                        const std::string& htpasswd = "") {
    for (int attempt = 0; attempt < 5 && port_ <= 0; ++attempt) {
      int port = FreePort();
      std::string yml =
          "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
          "storage:\n  filesystem:\n    rootdirectory: " +
          dir_.path +
          "/data\n  delete:\n    enabled: true\n"
          "http:\n  addr: 127.0.0.1:" +
          std::to_string(port) + "\n";
      if (!tls_cert.empty())
        yml += "  tls:\n    certificate: " + tls_cert + "\n    key: " + tls_key + "\n";
      if (!htpasswd.empty())
        yml += "auth:\n  htpasswd:\n    realm: sbx-test\n    path: " + htpasswd + "\n";
      Write(dir_.path + "/config.yml", yml);
      child_ = std::make_unique<Child>(
          std::vector<std::string>{"/usr/bin/docker-registry", "serve", dir_.path + "/config.yml"},
          dir_.path + "/log");
      if (WaitFor([&] { return !child_->Running() || Listening(port); }) && child_->Running())
        port_ = port;
      else
        child_.reset();
    }
    EXPECT_GT(port_, 0) << "docker-registry did not start: " << Slurp(dir_.path + "/log");
  }
  int port() const { return port_; }
  std::string host() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  TempDir dir_;
  std::unique_ptr<Child> child_;
  int port_ = -1;
};

// skopeo copy of `layout`:`tag` to docker://HOST/name:tag.
void Push(const std::string& layout, const std::string& tag, const std::string& dest,
          const std::string& creds = "", bool all = false) {
  std::vector<std::string> argv = {"/usr/bin/skopeo", "--insecure-policy", "copy",
                                   "--dest-tls-verify=false", "--quiet"};
  if (all) argv.push_back("--all");
  if (!creds.empty()) argv.push_back("--dest-creds=" + creds);
  argv.push_back("oci:" + layout + ":" + tag);
  argv.push_back("docker://" + dest);
  ProcessOptions po;
  po.env = {"HOME=" + layout, "TMPDIR=/tmp"};
  auto r = RunProcess(argv, po);
  ASSERT_EQ(r.exit_code, 0) << "skopeo: " << r.err << r.out;
}

class FakeRegistry {
 public:
  explicit FakeRegistry(const std::string& layout, const std::vector<std::string>& flags = {}) {
    std::vector<std::string> argv = {"/usr/bin/python3",
                                     SBX_SOURCE_DIR "/tests/registry/fake_registry.py",
                                     "--layout",
                                     layout,
                                     "--port-file",
                                     dir_.path + "/port",
                                     "--log",
                                     log()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    child_ = std::make_unique<Child>(argv, dir_.path + "/stderr");
    EXPECT_TRUE(WaitFor(
        [&] { return !child_->Running() || ::access((dir_.path + "/port").c_str(), F_OK) == 0; }));
    port_ = std::atoi(Slurp(dir_.path + "/port").c_str());
    EXPECT_GT(port_, 0) << "fake registry did not start: " << Slurp(dir_.path + "/stderr");
  }
  std::string host() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return dir_.path + "/requests"; }
  std::vector<json> Requests() const {
    std::vector<json> out;
    std::istringstream in(Slurp(log()));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }

 private:
  TempDir dir_;
  std::unique_ptr<Child> child_;
  int port_ = -1;
};

PullOptions Insecure() {
  PullOptions o;
  o.insecure_registries = {"127.0.0.1"};
  o.timeout = std::chrono::seconds(30);
  return o;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::string BlobPath(const std::string& layout, const std::string& digest) {
  return layout + "/blobs/sha256/" + digest.substr(7);
}

// The pulled layout is an OCI image layout whose index names `manifest` as `ref_name`, and
// holds every blob of `img` with its content.
void ExpectLayout(const std::string& dir, const PulledImage& p, const Layout::Image& img) {
  EXPECT_EQ(json::parse(Slurp(dir + "/oci-layout")),
            json::parse(R"({"imageLayoutVersion":"1.0.0"})"));
  json index = json::parse(Slurp(dir + "/index.json"));
  ASSERT_EQ(index["manifests"].size(), 1u) << index.dump();
  const json& m = index["manifests"][0];
  EXPECT_EQ(m["digest"], img.manifest.digest);
  EXPECT_EQ(m["size"], img.manifest.size);
  EXPECT_EQ(m["annotations"][kRefNameAnnotation], p.ref_name);
  EXPECT_EQ(m["platform"]["architecture"], "amd64");
  EXPECT_EQ(p.manifest_digest, img.manifest.digest);
  EXPECT_EQ(p.config_digest, img.config.digest);
  ASSERT_EQ(p.layers.size(), img.layers.size());
  for (size_t i = 0; i < img.layers.size(); ++i) EXPECT_EQ(p.layers[i], img.layers[i].digest);
  std::vector<Blob> all = img.layers;
  all.push_back(img.config);
  all.push_back(img.manifest);
  for (const auto& b : all) {
    std::string data = Slurp(BlobPath(dir, b.digest));
    EXPECT_EQ("sha256:" + store::Sha256Hex(data), b.digest);
    EXPECT_FALSE(Exists(BlobPath(dir, b.digest) + ".partial"));
  }
}

// ---- the real registry ----

TEST(RegistryPull, ByTagAndByDigestFromDockerRegistry) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  RealRegistry reg;
  ASSERT_GT(reg.port(), 0);
  Push(src.dir(), "v1", reg.host() + "/ns/small:v1");

  std::vector<Progress> seen;
  auto p = PullImage(Insecure(), reg.host() + "/ns/small:v1", t.path + "/out",
                     [&](const Progress& pr) { seen.push_back(pr); });
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->ref_name, reg.host() + "/ns/small:v1");
  EXPECT_EQ(p->digest, img.manifest.digest);
  ExpectLayout(t.path + "/out", *p, img);
  EXPECT_EQ(p->fetched_bytes, img.config.size + img.layers[0].size + img.layers[1].size);
  // Each blob's progress starts and ends with its size as the total.
  for (const auto& b : {img.config, img.layers[0], img.layers[1]}) {
    std::string what = b.digest.substr(7, 12);
    bool started = false, ended = false;
    for (const auto& pr : seen) {
      if (pr.what != what) continue;
      EXPECT_EQ(pr.total, b.size);
      started |= pr.done == 0;
      ended |= pr.done == b.size;
    }
    EXPECT_TRUE(started && ended) << what;
  }

  // By digest, into a fresh layout; and again into the same one (everything already there).
  std::string by_digest = reg.host() + "/ns/small@" + img.manifest.digest;
  p = PullImage(Insecure(), by_digest, t.path + "/out2");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->ref_name, by_digest);
  ExpectLayout(t.path + "/out2", *p, img);
  p = PullImage(Insecure(), by_digest, t.path + "/out2");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->fetched_bytes, 0);

  // A tag that is not there; a digest that is not there.
  auto missing = PullImage(Insecure(), reg.host() + "/ns/small:nope", t.path + "/out3");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().err(), ENOENT) << missing.status().message();
  missing = PullImage(Insecure(), reg.host() + "/ns/small@sha256:" + std::string(64, '0'),
                      t.path + "/out3");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().err(), ENOENT) << missing.status().message();
}

TEST(RegistryPull, PlainHttpIsRefusedWithoutInsecureRegistry) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  RealRegistry reg;
  ASSERT_GT(reg.port(), 0);
  Push(src.dir(), "v1", reg.host() + "/small:v1");
  PullOptions o;
  o.timeout = std::chrono::seconds(30);
  auto p = PullImage(o, reg.host() + "/small:v1", t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("--insecure-registry"), std::string::npos)
      << p.status().message();
  EXPECT_FALSE(Exists(t.path + "/out/index.json"));
  // Naming another host insecure does not help.
  o.insecure_registries = {"127.0.0.2", "127.0.0.1:1"};
  p = PullImage(o, reg.host() + "/small:v1", t.path + "/out");
  ASSERT_FALSE(p.ok());
  // host:port names it.
  o.insecure_registries = {reg.host()};
  p = PullImage(o, reg.host() + "/small:v1", t.path + "/out");
  ASSERT_TRUE(p.ok()) << p.status().message();
}

TEST(RegistryPull, IndexResolvesToLinuxAmd64) {
  TempDir t;
  Layout src(t.path + "/src");
  auto arm = src.AddImage({{{"etc/arch", "arm64\n"}}}, "arm64");
  auto amd = src.AddImage({{{"etc/arch", "amd64\n"}}}, "amd64");
  auto ppc = src.AddImage({{{"etc/arch", "ppc64le\n"}}}, "ppc64le");
  Blob index = src.AddIndex({{arm, "arm64"}, {amd, "amd64"}, {ppc, "ppc64le"}});
  src.Tag(index, "multi", true);
  RealRegistry reg;
  ASSERT_GT(reg.port(), 0);
  Push(src.dir(), "multi", reg.host() + "/multi:1", "", /*all=*/true);

  auto p = PullImage(Insecure(), reg.host() + "/multi:1", t.path + "/out");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->digest, index.digest);
  ExpectLayout(t.path + "/out", *p, amd);
  EXPECT_FALSE(Exists(BlobPath(t.path + "/out", arm.layers[0].digest)));

  PullOptions o = Insecure();
  o.architecture = "s390x";
  p = PullImage(o, reg.host() + "/multi:1", t.path + "/out2");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), ENOENT);
  EXPECT_NE(p.status().message().find("linux/arm64"), std::string::npos) << p.status().message();
}

// ---- TLS and basic auth on the real registry ----

struct Pki {
  explicit Pki(const std::string& dir)
      : ca(dir + "/ca.crt"), cert(dir + "/leaf.crt"), key(dir + "/leaf.key") {
    auto run = [](std::vector<std::string> argv) {
      auto r = RunProcess(argv);
      EXPECT_EQ(r.exit_code, 0) << r.err;
    };
    std::string cakey = dir + "/ca.key", csr = dir + "/leaf.csr", ext = dir + "/ext.cnf";
    run({"/usr/bin/openssl",
         "req",
         "-x509",
         "-newkey",
         "ec",
         "-pkeyopt",
         "ec_paramgen_curve:P-256",
         "-nodes",
         "-keyout",
         cakey,
         "-out",
         ca,
         "-subj",
         "/CN=sbx registry test CA",
         "-days",
         "2",
         "-addext",
         "basicConstraints=critical,CA:TRUE",
         "-addext",
         "keyUsage=critical,keyCertSign"});
    run({"/usr/bin/openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"});
    Write(ext, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
    run({"/usr/bin/openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", cakey,
         "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext});
  }
  std::string ca, cert, key;
};

std::string Htpasswd(const std::string& dir, const std::string& user, const std::string& pw) {
  auto r = RunProcess({"/usr/bin/python3", "-W", "ignore", "-c",
                       "import crypt,sys; print(sys.argv[1] + ':' + crypt.crypt(sys.argv[2], "
                       "crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))",
                       user, pw});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string path = dir + "/htpasswd";
  Write(path, r.out);
  return path;
}

TEST(RegistryPull, HttpsWithCaFileAndBasicAuth) {
  TempDir t;
  Pki pki(t.path);
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  RealRegistry reg(pki.cert, pki.key, Htpasswd(t.path, "alice", "s3cret pass"));
  ASSERT_GT(reg.port(), 0);
  Push(src.dir(), "v1", reg.host() + "/private:v1", "alice:s3cret pass");
  const std::string ref = reg.host() + "/private:v1";

  PullOptions o;
  o.timeout = std::chrono::seconds(30);
  o.ca_file = pki.ca;
  // Anonymous: the registry wants credentials.
  auto p = PullImage(o, ref, t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), EACCES) << p.status().message();
  EXPECT_NE(p.status().message().find("--username"), std::string::npos);
  // A wrong password, which never appears in the error.
  o.username = "alice";
  o.password = "wrong-password";
  p = PullImage(o, ref, t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), EACCES) << p.status().message();
  EXPECT_EQ(p.status().message().find("wrong-password"), std::string::npos);
  // Right.
  o.password = "s3cret pass";
  p = PullImage(o, ref, t.path + "/out");
  ASSERT_TRUE(p.ok()) << p.status().message();
  ExpectLayout(t.path + "/out", *p, img);
  // From a docker config file instead.
  PullOptions c;
  c.ca_file = pki.ca;
  c.docker_config = t.path + "/config.json";
  Write(c.docker_config,
        R"({"auths":{")" + reg.host() + R"(":{"auth":"YWxpY2U6czNjcmV0IHBhc3M="}}})");
  p = PullImage(c, ref, t.path + "/out-c");
  ASSERT_TRUE(p.ok()) << p.status().message();

  // The host's store does not know the test CA.
  PullOptions h = o;
  h.ca_file.clear();
  p = PullImage(h, ref, t.path + "/out2");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("certificate"), std::string::npos) << p.status().message();
  // The certificate names 127.0.0.1, not localhost: the host name is verified.
  p = PullImage(o, "localhost:" + std::to_string(reg.port()) + "/private:v1", t.path + "/out2");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("TLS"), std::string::npos) << p.status().message();
  // An HTTPS registry named insecure is spoken to in plain HTTP, as asked; it answers 400 and the
  // pull fails with nothing half-written.
  PullOptions i = o;
  i.insecure_registries = {"127.0.0.1"};
  p = PullImage(i, ref, t.path + "/out3");
  ASSERT_FALSE(p.ok());
  EXPECT_FALSE(Exists(t.path + "/out3/index.json"));
}

// ---- hostile and odd registries (the fake) ----

TEST(RegistryPull, TamperedBlobIsRefusedAndRemoved) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  FakeRegistry fake(src.dir(), {"--tamper", img.layers[1].digest});
  auto p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), EBADMSG) << p.status().message();
  EXPECT_FALSE(Exists(BlobPath(t.path + "/out", img.layers[1].digest)));
  EXPECT_FALSE(Exists(BlobPath(t.path + "/out", img.layers[1].digest) + ".partial"));
  EXPECT_FALSE(Exists(t.path + "/out/index.json"));
}

TEST(RegistryPull, BlobLongerThanItsDescriptorIsRefused) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  FakeRegistry fake(src.dir(), {"--long", img.layers[0].digest});
  auto p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), EFBIG) << p.status().message();
  EXPECT_FALSE(Exists(BlobPath(t.path + "/out", img.layers[0].digest) + ".partial"));
}

TEST(RegistryPull, ManifestTooLargeIsRefused) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  FakeRegistry fake(src.dir(), {"--big-manifest"});
  auto p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), EFBIG) << p.status().message();
}

TEST(RegistryPull, ImageLargerThanTheBoundIsRefusedBeforeFetching) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  FakeRegistry fake(src.dir());
  PullOptions o = Insecure();
  o.max_total_bytes = 1 << 19;
  auto p = PullImage(o, fake.host() + "/small:v1", t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), ENOSPC) << p.status().message();
  for (const auto& r : fake.Requests())
    EXPECT_EQ(r["path"].get<std::string>().find("/blobs/"), std::string::npos) << r.dump();
}

TEST(RegistryPull, InterruptedBlobIsResumedWithARange) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  const std::string big = img.layers[1].digest;
  {
    // One try per blob: the dropped connection fails the pull and leaves the partial blob.
    FakeRegistry fake(src.dir(), {"--drop-once", big});
    PullOptions o = Insecure();
    o.blob_attempts = 1;
    auto p = PullImage(o, fake.host() + "/small:v1", t.path + "/out");
    ASSERT_FALSE(p.ok());
    struct stat st {};
    ASSERT_EQ(::stat((BlobPath(t.path + "/out", big) + ".partial").c_str(), &st), 0);
    EXPECT_GT(st.st_size, 0);
    EXPECT_LT(st.st_size, img.layers[1].size);
    EXPECT_FALSE(Exists(t.path + "/out/index.json"));
    // What the next pull must fetch: the rest of each blob the first left unfinished (the other
    // layer, fetched beside the big one, may have stopped with it).
    int64_t missing = 0;
    std::vector<Blob> blobs = img.layers;
    blobs.push_back(img.config);
    for (const auto& b : blobs) {
      struct stat part {};
      const std::string path = BlobPath(t.path + "/out", b.digest);
      if (Exists(path)) continue;
      missing += b.size - (::stat((path + ".partial").c_str(), &part) == 0 ? part.st_size : 0);
    }
    EXPECT_GE(missing, img.layers[1].size - st.st_size);
    // The next pull continues from there.
    p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out");
    ASSERT_TRUE(p.ok()) << p.status().message();
    ExpectLayout(t.path + "/out", *p, img);
    EXPECT_EQ(p->fetched_bytes, missing);
    bool ranged = false;
    for (const auto& r : fake.Requests())
      ranged |= r["range"] == "bytes=" + std::to_string(st.st_size) + "-";
    EXPECT_TRUE(ranged);
  }
  {
    // With retries (the default), one pull gets over the dropped connection by itself.
    FakeRegistry fake(src.dir(), {"--drop-once", big});
    auto p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out2");
    ASSERT_TRUE(p.ok()) << p.status().message();
    ExpectLayout(t.path + "/out2", *p, img);
    int ranged = 0;
    for (const auto& r : fake.Requests()) ranged += r["range"] != "";
    EXPECT_EQ(ranged, 1);
  }
  {
    // A partial blob whose content is not the blob's start: the whole is verified, so the
    // mismatch is found, the partial removed, and the next pull fetches it whole.
    FakeRegistry fake(src.dir());
    ASSERT_TRUE(MakeDirs(t.path + "/out3/blobs/sha256", 0700).ok());
    Write(BlobPath(t.path + "/out3", big) + ".partial", "not the start of the blob");
    auto p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out3");
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().err(), EBADMSG);
    EXPECT_FALSE(Exists(BlobPath(t.path + "/out3", big) + ".partial"));
    p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out3");
    ASSERT_TRUE(p.ok()) << p.status().message();
    ExpectLayout(t.path + "/out3", *p, img);
  }
}

TEST(RegistryPull, BearerTokenAuth) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  FakeRegistry fake(src.dir(), {"--bearer", "bob:tok-pass"});
  const std::string ref = fake.host() + "/team/app:v1";
  auto p = PullImage(Insecure(), ref, t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), EACCES) << p.status().message();
  size_t anonymous_requests = fake.Requests().size();
  PullOptions o = Insecure();
  o.username = "bob";
  o.password = "tok-pass";
  p = PullImage(o, ref, t.path + "/out");
  ASSERT_TRUE(p.ok()) << p.status().message();
  ExpectLayout(t.path + "/out", *p, img);
  bool asked = false;
  auto requests = fake.Requests();
  for (size_t i = anonymous_requests; i < requests.size(); ++i) {
    const json& r = requests[i];
    std::string path = r["path"];
    if (path.rfind("/token?", 0) == 0) {
      asked = true;
      EXPECT_NE(path.find("service=fake-registry"), std::string::npos) << path;
      EXPECT_NE(path.find("scope=repository%3Ateam%2Fapp%3Apull"), std::string::npos) << path;
      EXPECT_EQ(r["auth"], "Basic");
    } else if (path.find("/blobs/") != std::string::npos) {
      EXPECT_EQ(r["auth"], "Bearer") << path;  // the token is reused, not fetched per blob
    }
  }
  EXPECT_TRUE(asked);

  // A registry whose token server serves anyone.
  FakeRegistry anon(src.dir(), {"--bearer-anonymous"});
  p = PullImage(Insecure(), anon.host() + "/team/app:v1", t.path + "/out2");
  ASSERT_TRUE(p.ok()) << p.status().message();
}

TEST(RegistryPull, BlobRedirectsAreFollowedOnlyToHttp) {
  TempDir t;
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  {
    FakeRegistry fake(src.dir(), {"--redirect"});
    auto p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out");
    ASSERT_TRUE(p.ok()) << p.status().message();
    ExpectLayout(t.path + "/out", *p, img);
  }
  for (const std::string& to : {std::string("file:///etc/passwd"), std::string("ftp://127.0.0.1/x"),
                                std::string("http://127.0.0.2:1/x")}) {
    FakeRegistry fake(src.dir(), {"--redirect-to", to});
    PullOptions o;
    o.insecure_registries = {"127.0.0.1:" + fake.host().substr(10)};
    o.timeout = std::chrono::seconds(30);
    auto p = PullImage(o, fake.host() + "/small:v1", t.path + "/out-" + std::to_string(to.size()));
    ASSERT_FALSE(p.ok()) << to;
    // file: and ftp: are no URLs to follow; plain HTTP to 127.0.0.2 is not a named registry.
    EXPECT_TRUE(p.status().err() == EPROTO || p.status().err() == EPERM)
        << to << ": " << p.status().message();
  }
}

TEST(RegistryPull, TwoPullsIntoOneDirectoryAtOnceAreRefused) {
  TempDir t;
  ASSERT_TRUE(MakeDirs(t.path + "/out", 0700).ok());
  UniqueFd held(::open((t.path + "/out").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_EQ(::flock(held.get(), LOCK_EX), 0);
  Layout src(t.path + "/src");
  auto img = SmallImage(src);
  src.Tag(img.manifest, "v1");
  FakeRegistry fake(src.dir());
  auto p = PullImage(Insecure(), fake.host() + "/small:v1", t.path + "/out");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().err(), EBUSY);
}

// ---- the CLI: sbx template pull, then a box runs on the template ----

TEST(RegistryPull, SbxTemplatePullRegistersATemplateABoxRunsOn) {
  TempDir t;
  ASSERT_EQ(::chmod(t.path.c_str(), 0711), 0);
  Layout src(t.path + "/src");
  auto busybox = ReadFile("/bin/busybox");
  ASSERT_TRUE(busybox.ok()) << "busybox-static is in DEB_PACKAGES";
  auto img = src.AddImage({{{"bin/busybox", *busybox}}, {{"etc/hello", "pulled\n"}}});
  src.Tag(img.manifest, "v1");
  RealRegistry reg;
  ASSERT_GT(reg.port(), 0);
  Push(src.dir(), "v1", reg.host() + "/bb:v1");
  const std::string data = t.path + "/data";
  ASSERT_EQ(::mkdir(data.c_str(), 0711), 0);
  const std::string ref = reg.host() + "/bb:v1";

  // Without --insecure-registry: refused, and it says what to do.
  auto r = RunProcess({SBX_BIN, "--data-dir", data, "template", "pull", "bb", ref});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--insecure-registry"), std::string::npos) << r.err;
  // No registry in the reference.
  r = RunProcess({SBX_BIN, "--data-dir", data, "template", "pull", "bb", "bb:v1"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("name the registry"), std::string::npos) << r.err;

  r = RunProcess({SBX_BIN, "--data-dir", data, "template", "pull", "bb", ref, "--insecure-registry",
                  reg.host()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "bb\n");
  for (const auto& l : img.layers)  // a progress line per layer (stderr is not a terminal)
    EXPECT_NE(r.err.find("fetch " + l.digest.substr(7, 12) + ": "), std::string::npos) << r.err;
  // The pull directory went once imported.
  EXPECT_FALSE(Exists(data + "/templates/pulls/" + store::Sha256Hex(ref).substr(0, 32)));

  r = RunProcess({SBX_BIN, "--data-dir", data, "template", "ls", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  bool listed = false;
  json listing = json::parse(r.out);  // named: a temporary's member would dangle in the loop
  for (const auto& tj : listing["templates"])
    if (tj["name"] == "bb") {
      listed = true;
      EXPECT_EQ(tj["layers"].size(), 2u) << tj.dump();
    }
  EXPECT_TRUE(listed) << r.out;
  // Taken without --replace; fine with it.
  r = RunProcess({SBX_BIN, "--data-dir", data, "template", "pull", "bb", ref, "--insecure-registry",
                  reg.host()});
  EXPECT_NE(r.exit_code, 0);
  r = RunProcess({SBX_BIN, "--data-dir", data, "template", "pull", "bb", ref, "--insecure-registry",
                  reg.host(), "--replace"});
  EXPECT_EQ(r.exit_code, 0) << r.err;

  ProcessOptions po;
  po.env = {"SBX_CGROUP_PARENT=sbx-registry-test-" + std::to_string(::getpid())};
  r = RunProcess({SBX_BIN, "--data-dir", data, "run", "--template", "bb", "--", "/bin/busybox",
                  "cat", "/etc/hello"},
                 po);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "pulled\n") << r.err;
  test::ExpectNoCgroupsAndRemoveParent("sbx-registry-test-" + std::to_string(::getpid()));
}

// An image a box can run: busybox as /bin/busybox and /bin/sh (busybox picks its applet by
// argv[0]), and `files` in a second layer.
Layout::Image BusyboxImage(Layout& layout,
                           const std::vector<std::pair<std::string, std::string>>& files) {
  auto busybox = ReadFile("/bin/busybox");
  EXPECT_TRUE(busybox.ok()) << "busybox-static is in DEB_PACKAGES";
  return layout.AddImage({{{"bin/busybox", *busybox}, {"bin/sh", *busybox}}, files});
}

// ---- builds FROM a registry image (docs/build.md "Images from registries") ----

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// `sbx build` with FROM REGISTRY/NAME:TAG: pulled (a progress line per layer), unpacked, run; the
// template runs in a box; a rebuild fetches the manifest and config again but no layer.
TEST(RegistryBuild, SbxBuildFromARegistryImage) {
  TempDir t;
  ASSERT_EQ(::chmod(t.path.c_str(), 0711), 0);
  Layout src(t.path + "/src");
  auto img = BusyboxImage(src, {{"etc/hello", "pulled\n"}});
  src.Tag(img.manifest, "v1");
  RealRegistry reg;
  ASSERT_GT(reg.port(), 0);
  Push(src.dir(), "v1", reg.host() + "/bb:v1");
  const std::string data = t.path + "/data", ctx = t.path + "/ctx";
  ASSERT_EQ(::mkdir(data.c_str(), 0711), 0);
  ASSERT_EQ(::mkdir(ctx.c_str(), 0755), 0);
  Write(ctx + "/Dockerfile", "FROM " + reg.host() +
                                 "/bb:v1\n"
                                 "RUN cat /etc/hello > /etc/copied && echo ran-in-build\n");
  ProcessOptions po;
  po.env = {"SBX_CGROUP_PARENT=sbx-registry-test-" + std::to_string(::getpid()), "HOME=" + t.path};

  // Plain HTTP to a registry not named insecure: refused, saying which flag.
  auto r = RunProcess({SBX_BIN, "--data-dir", data, "build", "-t", "built", ctx}, po);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--insecure-registry"), std::string::npos) << r.err << r.out;

  r = RunProcess(
      {SBX_BIN, "--data-dir", data, "build", "-t", "built", "--insecure-registry", reg.host(), ctx},
      po);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  for (const auto& l : img.layers)
    EXPECT_NE(r.out.find("fetch " + l.digest.substr(7, 12) + ": "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Pulled " + reg.host() + "/bb:v1 (" + img.manifest.digest),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ran-in-build"), std::string::npos) << r.out;
  r = RunProcess({SBX_BIN, "--data-dir", data, "run", "--template", "built", "--", "/bin/busybox",
                  "cat", "/etc/copied"},
                 po);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "pulled\n") << r.err;
  // The template records what was pulled.
  r = RunProcess({SBX_BIN, "--data-dir", data, "template", "inspect", "built"}, po);
  EXPECT_NE(r.out.find("from " + reg.host() + "/bb:v1 (" + img.manifest.digest + ")"),
            std::string::npos)
      << r.out;

  // Again: the layers are in the cache (no blob but the config is fetched), the RUN is cached.
  r = RunProcess(
      {SBX_BIN, "--data-dir", data, "build", "-t", "built", "--insecure-registry", reg.host(), ctx},
      po);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("Using cached layers of " + img.manifest.digest), std::string::npos)
      << r.out;
  EXPECT_EQ(Count(r.out, "Using cache\n"), 1u) << r.out;
  for (const auto& l : img.layers)
    EXPECT_EQ(r.out.find("fetch " + l.digest.substr(7, 12)), std::string::npos) << r.out;

  // A bare name that is no template is not an implied docker.io/library/NAME:latest.
  Write(ctx + "/Dockerfile", "FROM nosuchtemplate\n");
  r = RunProcess({SBX_BIN, "--data-dir", data, "build", "-t", "other", ctx}, po);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("template not found"), std::string::npos) << r.err;
  // A local template "name:tag" wins over the registry reading of it (docker.io/library/...).
  Write(ctx + "/Dockerfile", "FROM built\nRUN true\n");
  r = RunProcess({SBX_BIN, "--data-dir", data, "build", "-t", "mine:v2", ctx}, po);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  Write(ctx + "/Dockerfile", "FROM mine:v2\nRUN test -f /etc/copied\n");
  r = RunProcess({SBX_BIN, "--data-dir", data, "build", "-t", "other", ctx}, po);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(r.out.find("Pulling"), std::string::npos) << r.out;
  test::ExpectNoCgroupsAndRemoveParent("sbx-registry-test-" + std::to_string(::getpid()));
}

// Daemon builds: E2B's template build with fromImage through --registry-mirror, the registry
// allowlist (a ref to a host not allowed, a redirect to loopback not listed: refused, with no
// request reaching them), credentials per key, none of them in a log, the audit or the store.
class DaemonBuild : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::chmod(t_.path.c_str(), 0711), 0);
    data_ = t_.path + "/data";
    ASSERT_EQ(::mkdir(data_.c_str(), 0711), 0);
    ::setenv("SBX_CGROUP_PARENT", Parent().c_str(), 1);
  }
  void TearDown() override {
    if (d_) {
      EXPECT_TRUE(d_->Alive()) << d_->log();
      d_.reset();
    }
    test::ExpectNoCgroupsAndRemoveParent(Parent());
  }
  static std::string Parent() { return "sbx-registry-test-" + std::to_string(::getpid()); }
  void Start(std::vector<std::string> flags) {
    d_ = std::make_unique<test::DaemonProcess>(data_);
    d_->set_serve_flags(std::move(flags));
    d_->Start();
  }
  store::NewApiKey Key(const std::string& name) {
    auto st = store::Store::Open(data_ + "/" + store::kDbFileName);
    EXPECT_TRUE(st.ok()) << st.status().message();
    auto k = (*st)->CreateApiKey(name, 0, 0, false);
    EXPECT_TRUE(k.ok()) << k.status().message();
    return k.ok() ? *k : store::NewApiKey{};
  }
  http::Response Call(const std::string& key, const std::string& method, const std::string& target,
                      const std::string& body = "") {
    http::ClientHeaders h = {{"Content-Type", "application/json"},
                             {"X-API-Key", key},
                             {"Authorization", "Bearer " + key}};
    auto r = http::Request(http::Endpoint{"127.0.0.1", d_->port(), ""}, method, target, h, body,
                           std::chrono::seconds(60));
    EXPECT_TRUE(r.ok()) << method << " " << target << ": " << r.status().message();
    return r.ok() ? *r : http::Response{};
  }
  // POST /v3/templates then the build's start with `start`: the start's answer, and the
  // template and build ids.
  http::Response Build(const std::string& key, const std::string& name, const json& start,
                       std::string* bid) {
    auto made = Call(key, "POST", "/v3/templates", json{{"name", name}}.dump());
    EXPECT_EQ(made.status, 202) << made.body;
    json j = json::parse(made.body, nullptr, false);
    *bid = j.value("buildID", "");
    return Call(key, "POST", "/v2/templates/" + name + "/builds/" + *bid, start.dump());
  }
  // Polls the build's status until it is ready or error (bounded: 120 s); its last answer, with
  // every log line in "all_logs".
  json Wait(const std::string& key, const std::string& name, const std::string& bid) {
    json last;
    std::string logs;
    size_t offset = 0;
    for (int i = 0; i < 12000; ++i) {
      auto r = Call(
          key, "GET",
          "/templates/" + name + "/builds/" + bid + "/status?logsOffset=" + std::to_string(offset));
      last = json::parse(r.body, nullptr, false);
      if (last.is_discarded()) break;
      for (const auto& e : last.value("logEntries", json::array())) {
        logs += e.value("message", "") + "\n";
        ++offset;
      }
      std::string st = last.value("status", "");
      if (st == "ready" || st == "error") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    last["all_logs"] = logs;
    return last;
  }

  TempDir t_;
  std::string data_;
  std::unique_ptr<test::DaemonProcess> d_;
};

TEST_F(DaemonBuild, FromImageThroughAMirrorAndTheAllowlist) {
  Layout src(t_.path + "/src");
  auto img = BusyboxImage(src, {{"etc/hello", "mirrored\n"}});
  src.Tag(img.manifest, "v1");
  RealRegistry reg;
  ASSERT_GT(reg.port(), 0);
  Push(src.dir(), "v1", reg.host() + "/library/bb:v1");
  FakeRegistry other(src.dir());  // allowed by nobody
  FakeRegistry sink(src.dir());   // where a redirect would lead: loopback, not listed
  FakeRegistry redirecting(
      src.dir(), {"--redirect-to", "http://localhost:" + sink.host().substr(10) + "/storage/x"});
  Start({"--registry-mirror", "docker.io=" + reg.host(), "--insecure-registry", reg.host(),
         "--registry", redirecting.host(), "--insecure-registry", "127.0.0.1",
         "--insecure-registry", "localhost"});
  const std::string key = d_->key();

  // fromImage "bb:v1" is docker.io/library/bb:v1: pulled from the mirror, then RUN on it.
  std::string bid;
  json start = {{"fromImage", "bb:v1"},
                {"steps", {{{"type", "RUN"}, {"args", {"cat /etc/hello > /etc/copied"}}}}}};
  auto r = Build(key, "mirrored", start, &bid);
  ASSERT_EQ(r.status, 202) << r.body;
  json done = Wait(key, "mirrored", bid);
  ASSERT_EQ(done.value("status", ""), "ready") << done.dump();
  EXPECT_NE(done["all_logs"].get<std::string>().find("Pulled docker.io/library/bb:v1"),
            std::string::npos)
      << done.dump();
  auto box = Call(key, "POST", "/v1/sandboxes", R"({"template":"mirrored"})");
  ASSERT_EQ(box.status, 201) << box.body;
  std::string id = json::parse(box.body)["id"];
  auto out = Call(key, "POST", "/v1/sandboxes/" + id + "/commands",
                  json{{"argv", {"/bin/busybox", "cat", "/etc/copied"}}}.dump());
  EXPECT_NE(out.body.find(Base64Encode("mirrored\n")), std::string::npos) << out.body;
  Call(key, "DELETE", "/v1/sandboxes/" + id);

  // A registry nobody allowed: 403 naming the flag, and not one request reaches it.
  r = Build(key, "elsewhere", {{"fromImage", other.host() + "/bb:v1"}}, &bid);
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("--registry"), std::string::npos) << r.body;
  // Nor a raw IP, a name, a port of a listed host that is not the listed one.
  for (const char* ref : {"198.18.0.1:5000/x:1", "example.com/x", "127.0.0.1:1/x:1"}) {
    r = Build(key, "elsewhere", {{"fromImage", ref}}, &bid);
    EXPECT_EQ(r.status, 403) << ref << ": " << r.body;
  }
  EXPECT_TRUE(other.Requests().empty());

  // An allowed registry that redirects the blobs to loopback it was not listed for: the build
  // fails, and the redirect's target hears nothing.
  r = Build(key, "redirected", {{"fromImage", redirecting.host() + "/bb:v1"}}, &bid);
  ASSERT_EQ(r.status, 202) << r.body;
  done = Wait(key, "redirected", bid);
  EXPECT_EQ(done.value("status", ""), "error") << done.dump();
  EXPECT_NE(done.dump().find("not a registry the operator named"), std::string::npos)
      << done.dump();
  EXPECT_TRUE(sink.Requests().empty());
  EXPECT_FALSE(redirecting.Requests().empty());

  // Cloud registries' credentials are not something sbx exchanges.
  for (const char* type : {"aws", "gcp"}) {
    r = Build(key, "cloud",
              {{"fromImage", "bb:v1"},
               {"fromImageRegistry", {{"type", type}, {"awsAccessKeyId", "AKIDSECRETVALUE"}}}},
              &bid);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find(type), std::string::npos) << r.body;
    EXPECT_EQ(r.body.find("AKIDSECRETVALUE"), std::string::npos) << r.body;
  }
}

// A private image pulled with one key's credentials is not another key's by reference: every
// pull fetches the manifest with the requester's credentials, even when the layers are cached.
TEST_F(DaemonBuild, PrivateImagesNeedEachKeysCredentials) {
  Layout src(t_.path + "/src");
  auto img = BusyboxImage(src, {{"etc/hello", "private\n"}});
  src.Tag(img.manifest, "v1");
  const std::string password = "pw-Zq81-never-logged";
  FakeRegistry reg(src.dir(), {"--basic", "alice:" + password});
  Start({"--registry", reg.host(), "--insecure-registry", reg.host()});
  store::NewApiKey a = Key("tenant-a"), b = Key("tenant-b");
  const std::string ref = reg.host() + "/team/app:v1";

  std::string bid;
  json with = {
      {"fromImage", ref},
      {"fromImageRegistry", {{"type", "registry"}, {"username", "alice"}, {"password", password}}}};
  auto r = Build(a.secret, "private-a", with, &bid);
  ASSERT_EQ(r.status, 202) << r.body;
  json done = Wait(a.secret, "private-a", bid);
  ASSERT_EQ(done.value("status", ""), "ready") << done.dump();

  // Key b: no credentials, then wrong ones. Refused by the registry, though every layer is cached.
  size_t before = reg.Requests().size();
  r = Build(b.secret, "private-b", {{"fromImage", ref}}, &bid);
  ASSERT_EQ(r.status, 202) << r.body;
  done = Wait(b.secret, "private-b", bid);
  EXPECT_EQ(done.value("status", ""), "error") << done.dump();
  EXPECT_NE(done.dump().find("wants credentials"), std::string::npos) << done.dump();
  json wrong = {{"fromImage", ref},
                {"fromImageRegistry",
                 {{"type", "registry"}, {"username", "alice"}, {"password", "wrong-Kx7-guess"}}}};
  r = Build(b.secret, "private-b2", wrong, &bid);
  ASSERT_EQ(r.status, 202) << r.body;
  done = Wait(b.secret, "private-b2", bid);
  EXPECT_EQ(done.value("status", ""), "error") << done.dump();
  EXPECT_NE(done.dump().find("refused the credentials"), std::string::npos) << done.dump();
  EXPECT_EQ(done.dump().find("wrong-Kx7-guess"), std::string::npos) << done.dump();
  auto requests = reg.Requests();
  for (size_t i = before; i < requests.size(); ++i)
    EXPECT_EQ(requests[i]["path"].get<std::string>().find("/blobs/"), std::string::npos)
        << requests[i].dump();
  // And key a again: the manifest with a's credentials, the layers from the cache.
  before = reg.Requests().size();
  r = Build(a.secret, "private-a", with, &bid);
  ASSERT_EQ(r.status, 202) << r.body;
  done = Wait(a.secret, "private-a", bid);
  ASSERT_EQ(done.value("status", ""), "ready") << done.dump();
  EXPECT_NE(done["all_logs"].get<std::string>().find("Using cached layers"), std::string::npos)
      << done.dump();
  requests = reg.Requests();
  bool manifest = false;
  for (size_t i = before; i < requests.size(); ++i) {
    std::string path = requests[i]["path"];
    manifest |= path.find("/manifests/") != std::string::npos;
    bool layer = false;
    for (const auto& l : img.layers) layer |= path.find(l.digest) != std::string::npos;
    EXPECT_FALSE(layer) << path;
  }
  EXPECT_TRUE(manifest);

  // The passwords are nowhere the daemon writes: its log, its store (and so the audit events).
  d_->Stop();
  std::string everything = d_->log();
  auto files = RunProcess({"/bin/sh", "-c", "cat " + data_ + "/sbx.db* 2>/dev/null"});
  everything += files.out;
  EXPECT_EQ(everything.find(password), std::string::npos);
  EXPECT_EQ(everything.find("wrong-Kx7-guess"), std::string::npos);
  EXPECT_EQ(everything.find(Base64Encode("alice:" + password)), std::string::npos);
  d_.reset();
}

// ---- sweeps: what killed pulls, builds and uploads leave ----

// `sbx template pull` SIGKILLed mid-blob leaves its directory (the partial blob, kept for a
// resume); a daemon start removes it, and the staging directory and upload temp file of dead
// writers, while a pull still running beside the daemon keeps its directory through the daemon's
// start and a `sbx template gc`, which takes it once that pull is killed too.
TEST(RegistryPull, KilledPullsAreSweptAtDaemonStartAndALiveOneIsKept) {
  TempDir t;
  ASSERT_EQ(::chmod(t.path.c_str(), 0711), 0);
  Layout src(t.path + "/src");
  auto img = src.AddImage({{{"data/noise", Noise(4 << 20, 11)}}});
  src.Tag(img.manifest, "v1");
  src.Tag(img.manifest, "v2");
  FakeRegistry fake(src.dir(), {"--stall", img.layers[0].digest});
  const std::string data = t.path + "/data";
  ASSERT_EQ(::mkdir(data.c_str(), 0711), 0);
  const std::string pulls = data + "/templates/pulls/";
  auto pull = [&](const std::string& name, const std::string& tag, std::string* dir) {
    std::string ref = fake.host() + "/img:" + tag;
    *dir = pulls + store::Sha256Hex(ref).substr(0, 32);
    auto c = std::make_unique<Child>(
        std::vector<std::string>{SBX_BIN, "--data-dir", data, "template", "pull", name, ref,
                                 "--insecure-registry", fake.host()},
        t.path + "/pull-" + tag + ".log");
    // Mid-way: the stalled layer's partial blob has bytes.
    std::string partial = *dir + "/blobs/sha256/" + img.layers[0].digest.substr(7) + ".partial";
    EXPECT_TRUE(WaitFor([&] {
      struct stat st {};
      return ::stat(partial.c_str(), &st) == 0 && st.st_size > 0;
    })) << Slurp(t.path + "/pull-" + tag + ".log");
    return c;
  };
  std::string killed_dir, live_dir;
  auto killed = pull("killed", "v1", &killed_dir);
  killed->Kill();
  auto live = pull("live", "v2", &live_dir);
  ASSERT_TRUE(live->Running());
  // A dead writer's build staging directory and upload temp file (pid 1's start time is not 1).
  const std::string staging = data + "/templates/staging/1-1-deadbeef";
  ASSERT_TRUE(MakeDirs(staging, 0700).ok());
  ASSERT_TRUE(MakeDirs(data + "/build-files/key_deadwriter1", 0700).ok());
  const std::string upload = data + "/build-files/key_deadwriter1/.tmp-1-1-abcdef";
  Write(upload, "half an upload");
  ASSERT_TRUE(Exists(killed_dir));

  {
    test::DaemonProcess d(data);
    d.Start();
    EXPECT_FALSE(Exists(killed_dir)) << d.log();
    EXPECT_FALSE(Exists(killed_dir + ".lock"));
    EXPECT_FALSE(Exists(staging));
    EXPECT_FALSE(Exists(upload));
    EXPECT_TRUE(Exists(live_dir)) << "the live pull's directory went";
    EXPECT_NE(d.log().find("swept 1 abandoned pull directories and 1 upload temp files"),
              std::string::npos)
        << d.log();
    // gc beside the daemon and the live pull: the pull keeps its directory.
    auto gc = RunProcess({SBX_BIN, "--data-dir", data, "template", "gc"});
    EXPECT_EQ(gc.exit_code, 0) << gc.err;
    EXPECT_TRUE(Exists(live_dir));
    EXPECT_TRUE(live->Running());
    d.Stop();
  }
  live->Kill();
  auto gc = RunProcess({SBX_BIN, "--data-dir", data, "template", "gc"});
  EXPECT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_FALSE(Exists(live_dir));
  EXPECT_FALSE(Exists(live_dir + ".lock"));
  auto left = RunProcess({"/usr/bin/find", data + "/templates/pulls", "-mindepth", "1"});
  EXPECT_EQ(left.out, "");
}

}  // namespace
}  // namespace sbx::storage
