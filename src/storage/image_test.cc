// The content-addressed layer store and OCI import (image.h), on real files: OCI image layouts
// and docker-archives are written here with libarchive (tars, gzip and zstd, their digests),
// hostile ones included, and whiteouts are checked through a real overlay mount in a private
// mount namespace.
#include "storage/image.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::storage {
namespace {

using nlohmann::json;

struct TarEntry {
  std::string name;
  char type = 'f';      // f file, d dir, l symlink, h hard link, c char device, b block device
  std::string content;  // a file's content; a link's target
  int uid = 0;
  int mode = 0644;
};

la_ssize_t AppendToString(archive*, void* data, const void* buf, size_t n) {
  static_cast<std::string*>(data)->append(static_cast<const char*>(buf), n);
  return static_cast<la_ssize_t>(n);
}

std::string MakeTar(const std::vector<TarEntry>& entries) {
  std::string out;
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_set_bytes_in_last_block(a, 1);
  archive_write_open(a, &out, nullptr, AppendToString, nullptr);
  for (const auto& en : entries) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, en.name.c_str());
    archive_entry_set_uid(e, en.uid);
    archive_entry_set_gid(e, en.uid);
    archive_entry_set_perm(e, en.mode);
    switch (en.type) {
      case 'd':
        archive_entry_set_filetype(e, AE_IFDIR);
        break;
      case 'l':
        archive_entry_set_filetype(e, AE_IFLNK);
        archive_entry_set_symlink(e, en.content.c_str());
        break;
      case 'h':
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_hardlink(e, en.content.c_str());
        break;
      case 'c':
      case 'b':
        archive_entry_set_filetype(e, en.type == 'c' ? AE_IFCHR : AE_IFBLK);
        archive_entry_set_rdev(e, makedev(8, 0));
        break;
      default:
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_size(e, static_cast<la_int64_t>(en.content.size()));
    }
    archive_write_header(a, e);
    if (en.type == 'f') archive_write_data(a, en.content.data(), en.content.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

std::string Compress(const std::string& data, const std::string& how) {
  if (how == "none") return data;
  std::string out;
  archive* a = archive_write_new();
  archive_write_set_format_raw(a);
  if (how == "gzip") archive_write_add_filter_gzip(a);
  if (how == "zstd") archive_write_add_filter_zstd(a);
  archive_write_set_bytes_in_last_block(a, 1);
  archive_write_open(a, &out, nullptr, AppendToString, nullptr);
  archive_entry* e = archive_entry_new();
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
  archive_write_header(a, e);
  archive_write_data(a, data.data(), data.size());
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

std::string Sha(const std::string& data) {
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", md[i]);
    hex += b;
  }
  return hex;
}

struct Layer {
  std::string blob;  // as stored
  std::string blob_hex, diff_hex, media;
};

Layer MakeLayer(const std::vector<TarEntry>& entries, const std::string& how = "gzip") {
  Layer l;
  std::string tar = MakeTar(entries);
  l.diff_hex = Sha(tar);
  l.blob = Compress(tar, how);
  l.blob_hex = Sha(l.blob);
  l.media = how == "none"   ? "application/vnd.oci.image.layer.v1.tar"
            : how == "gzip" ? "application/vnd.oci.image.layer.v1.tar+gzip"
                            : "application/vnd.oci.image.layer.v1.tar+zstd";
  return l;
}

json ImageConfigJson(const std::vector<Layer>& layers, const json& config,
                     const std::string& arch = "amd64") {
  json diff_ids = json::array();
  for (const auto& l : layers) diff_ids.push_back("sha256:" + l.diff_hex);
  return {{"architecture", arch},
          {"os", "linux"},
          {"config", config},
          {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
}

class ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-image-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ts_.dir = dir_ + "/templates";
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    st_ = std::move(*st);
  }
  void TearDown() override { (void)RemoveTree(dir_); }  // scratch: a leftover harms no result

  void Put(const std::string& path, const std::string& content) {
    ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok());
    ASSERT_TRUE(WriteFile(path, content, 0644).ok()) << path;
  }

  // Writes blob `data` into the OCI layout `layout`; returns its descriptor.
  json Blob(const std::string& layout, const std::string& data, const std::string& media) {
    std::string hex = Sha(data);
    Put(layout + "/blobs/sha256/" + hex, data);
    return {{"mediaType", media}, {"digest", "sha256:" + hex}, {"size", data.size()}};
  }

  // An OCI image layout with one image of `layers` (base first) and `config`, named `ref`;
  // with `index`, the manifest sits behind an image index that also lists an arm64 image.
  std::string Oci(const std::string& name, const std::vector<Layer>& layers, const json& config,
                  const std::string& ref = "", bool index = false) {
    std::string layout = dir_ + "/" + name;
    Put(layout + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
    json cfg = Blob(layout, ImageConfigJson(layers, config).dump(),
                    "application/vnd.oci.image.config.v1+json");
    json ls = json::array();
    for (const auto& l : layers) ls.push_back(Blob(layout, l.blob, l.media));
    json manifest = {{"schemaVersion", 2},
                     {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                     {"config", cfg},
                     {"layers", ls}};
    json top = Blob(layout, manifest.dump(), "application/vnd.oci.image.manifest.v1+json");
    if (index) {
      json arm = manifest;
      arm["config"] = Blob(layout, ImageConfigJson(layers, config, "arm64").dump(),
                           "application/vnd.oci.image.config.v1+json");
      json arm_d = Blob(layout, arm.dump(), "application/vnd.oci.image.manifest.v1+json");
      arm_d["platform"] = {{"os", "linux"}, {"architecture", "arm64"}};
      top["platform"] = {{"os", "linux"}, {"architecture", "amd64"}};
      json idx = {{"schemaVersion", 2},
                  {"mediaType", "application/vnd.oci.image.index.v1+json"},
                  {"manifests", {arm_d, top}}};
      top = Blob(layout, idx.dump(), "application/vnd.oci.image.index.v1+json");
    }
    if (!ref.empty()) top["annotations"] = {{"org.opencontainers.image.ref.name", ref}};
    json index_json = {{"schemaVersion", 2}, {"manifests", {top}}};
    Put(layout + "/index.json", index_json.dump());
    return layout;
  }

  // A `docker save` tarball: manifest.json, <config hex>.json, <n>/layer.tar (uncompressed).
  std::string DockerArchive(const std::string& name, const std::vector<Layer>& layers,
                            const json& config, const std::vector<std::string>& tags) {
    std::string cfg = ImageConfigJson(layers, config).dump();
    std::vector<TarEntry> entries;
    json layer_names = json::array();
    for (size_t i = 0; i < layers.size(); ++i) {
      std::string n = std::to_string(i) + "/layer.tar";
      entries.push_back({std::to_string(i), 'd', "", 0, 0755});
      entries.push_back({n, 'f', layers[i].blob});
      layer_names.push_back(n);
    }
    entries.push_back({Sha(cfg) + ".json", 'f', cfg});
    json manifest = json::array(
        {{{"Config", Sha(cfg) + ".json"}, {"RepoTags", tags}, {"Layers", layer_names}}});
    entries.push_back({"manifest.json", 'f', manifest.dump()});
    std::string path = dir_ + "/" + name;
    Put(path, MakeTar(entries));
    return path;
  }

  std::vector<std::string> Ls(const std::string& d) {
    std::vector<std::string> out;
    if (DIR* dd = ::opendir(d.c_str())) {
      while (dirent* e = ::readdir(dd)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      ::closedir(dd);
    }
    return out;
  }

  bool Exists(const std::string& p) {
    struct stat sb {};
    return ::lstat(p.c_str(), &sb) == 0;
  }

  // Nothing of a failed import is left: no layer, no staging directory, no record.
  void ExpectNothingLeft(const std::string& why) {
    EXPECT_TRUE(Ls(ts_.dir + "/layers").empty()) << why;
    EXPECT_TRUE(Ls(ts_.dir + "/staging").empty()) << why;
    EXPECT_EQ(*st_->LayerBytes(), 0) << why;
  }

  // Adds a layer of `entries` from a blob file.
  Result<store::LayerRecord> AddBlob(const std::vector<TarEntry>& entries,
                                     const std::string& how = "gzip", const std::string& pin = "") {
    Layer l = MakeLayer(entries, how);
    std::string path = dir_ + "/blob-" + l.blob_hex;
    Put(path, l.blob);
    return AddLayerFromBlob(ts_, *st_, path, "sha256:" + l.blob_hex, "sha256:" + l.diff_hex, pin);
  }

  std::string dir_;
  TemplateStore ts_;
  std::unique_ptr<store::Store> st_;
};

TEST_F(ImageTest, LayerIdsAreDiffIds) {
  std::string hex(64, 'a');
  EXPECT_EQ(*LayerIdForDiffId("sha256:" + hex), "sha256-" + hex);
  for (const std::string& bad :
       std::vector<std::string>{"", "sha256:", "sha512:" + hex, "sha256:" + hex.substr(1),
                                "sha256:" + std::string(64, 'A'), "sha256:../" + hex.substr(3)})
    EXPECT_EQ(LayerIdForDiffId(bad).status().err(), EINVAL) << bad;
}

TEST_F(ImageTest, ImportsAnOciLayoutWithItsConfigAsTheTemplatesDefaults) {
  Layer base =
      MakeLayer({{"etc", 'd', "", 0, 0755},
                 {"etc/passwd", 'f', "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n"},
                 {"bin", 'd', "", 0, 0755},
                 {"bin/tool", 'f', "#!/bin/sh\n", 0, 04755}},
                "gzip");
  Layer top =
      MakeLayer({{"app", 'd', "", 1000, 0755}, {"app/main.py", 'f', "print(1)\n", 1000}}, "zstd");
  json config = {{"Env", {"PATH=/opt/py/bin:/usr/bin:/bin", "PYTHONUNBUFFERED=1"}},
                 {"User", "1000:1000"},
                 {"WorkingDir", "/app"},
                 {"Entrypoint", {"python3"}},
                 {"Cmd", {"main.py"}},
                 {"ExposedPorts", {{"8080/tcp", json::object()}}},
                 {"Labels", {{"org.example", "yes"}}}};
  std::string layout = Oci("layout", {base, top}, config, "py:3.12");
  int reports = 0;
  auto t = ImportImage(ts_, *st_, "py:3.12", layout, "", false,
                       [&](const Progress& p) { reports += p.done >= 0 ? 1 : 0; });
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_GT(reports, 0);
  EXPECT_EQ(t->kind, store::kTemplateOci);
  EXPECT_EQ(t->layers,
            (std::vector<std::string>{"sha256-" + top.diff_hex, "sha256-" + base.diff_hex}));
  EXPECT_GT(t->size_bytes, 0);
  // The unpacked files with their owners and set-id bits.
  std::string b = LayerDir(ts_, "sha256-" + base.diff_hex);
  struct stat sb {};
  ASSERT_EQ(::lstat((b + "/bin/tool").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 04755u);
  ASSERT_EQ(::lstat((LayerDir(ts_, "sha256-" + top.diff_hex) + "/app/main.py").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 1000u);
  EXPECT_TRUE(Ls(ts_.dir + "/staging").empty());

  auto cfg = GetImageConfig(*st_, "py:3.12");
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  EXPECT_EQ(cfg->user, "1000:1000");
  EXPECT_EQ(cfg->workdir, "/app");
  EXPECT_EQ(cfg->entrypoint, std::vector<std::string>{"python3"});
  EXPECT_EQ(cfg->cmd, std::vector<std::string>{"main.py"});
  EXPECT_EQ(cfg->exposed_ports, std::vector<std::string>{"8080/tcp"});
  EXPECT_EQ(cfg->labels.at("org.example"), "yes");
  EXPECT_EQ(GetImageConfig(*st_, "nope").status().err(), EINVAL);

  // What a sandbox of it gets: the image's env over the defaults (its PATH wins), its user and
  // workdir; the layers pinned for the sandbox.
  auto r = ResolveTemplate(ts_, *st_, "py:3.12", "sb1");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->layers.size(), 2u);
  EXPECT_EQ(r->env, (std::vector<std::string>{"PATH=/opt/py/bin:/usr/bin:/bin", "LANG=C.UTF-8",
                                              "PYTHONUNBUFFERED=1"}));
  EXPECT_EQ(r->user, "1000:1000");
  EXPECT_EQ(r->workdir, "/app");
  EXPECT_EQ(r->entrypoint, std::vector<std::string>{"python3"});
  EXPECT_EQ(r->cmd, std::vector<std::string>{"main.py"});

  // Taken without --replace; replaced with it.
  EXPECT_EQ(ImportImage(ts_, *st_, "py:3.12", layout, "", false).status().err(), EEXIST);
  ASSERT_TRUE(ImportImage(ts_, *st_, "py:3.12", layout, "py:3.12", true).ok());
  EXPECT_EQ(ImportImage(ts_, *st_, "other", layout, "py:3.13", false).status().err(), ENOENT);
}

TEST_F(ImageTest, AnImageIndexResolvesToLinuxAmd64) {
  Layer l = MakeLayer({{"hello", 'f', "amd64\n"}}, "none");
  std::string layout = Oci("indexed", {l}, {{"User", "app"}}, "", true);
  auto t = ImportImage(ts_, *st_, "multi", layout, "", false);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(GetImageConfig(*st_, "multi")->user, "app");
  // An image only for another architecture is refused.
  std::string arm = dir_ + "/arm";
  Put(arm + "/oci-layout", "{}");
  json cfg = Blob(arm, ImageConfigJson({l}, json::object(), "arm64").dump(), "");
  json man = {{"config", cfg}, {"layers", {Blob(arm, l.blob, l.media)}}};
  Put(arm + "/index.json", json{{"manifests", {Blob(arm, man.dump(), "")}}}.dump());
  EXPECT_EQ(ImportImage(ts_, *st_, "arm", arm, "", false).status().err(), EINVAL);
}

TEST_F(ImageTest, ImportsADockerArchivePickingTheTagAndSharesLayersAcrossTemplates) {
  Layer base = MakeLayer({{"base.txt", 'f', "base\n"}}, "none");
  Layer top = MakeLayer({{"top.txt", 'f', "top\n"}}, "none");
  std::string tarball =
      DockerArchive("img.tar", {base, top}, {{"WorkingDir", "/srv"}}, {"example/app:1"});
  auto t = ImportImage(ts_, *st_, "app", tarball, "example/app:1", false);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->layers.size(), 2u);
  EXPECT_EQ(GetImageConfig(*st_, "app")->workdir, "/srv");
  EXPECT_EQ(ImportImage(ts_, *st_, "x", tarball, "example/other", false).status().err(), ENOENT);
  // The same base layer in an OCI layout: one directory, one record, two templates.
  std::string layout = Oci("other", {base}, json::object());
  auto o = ImportImage(ts_, *st_, "other", layout, "", false);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->layers, std::vector<std::string>{"sha256-" + base.diff_hex});
  EXPECT_EQ(Ls(ts_.dir + "/layers").size(), 2u);
  EXPECT_EQ(st_->ListLayers()->size(), 2u);
  EXPECT_TRUE(Ls(ts_.dir + "/staging").empty());
  // Removing one template keeps the shared layer for the other; gc frees nothing in use.
  ASSERT_TRUE(RemoveTemplate(ts_, *st_, "app").ok());
  auto gc = GcLayers(ts_, *st_);
  ASSERT_TRUE(gc.ok());
  EXPECT_TRUE(Exists(LayerDir(ts_, "sha256-" + base.diff_hex)));
  EXPECT_FALSE(Exists(LayerDir(ts_, "sha256-" + top.diff_hex)));
}

TEST_F(ImageTest, HostileArchivesAreRefusedAndLeaveNothing) {
  const std::string outside = dir_ + "/outside";
  ASSERT_TRUE(MakeDirs(outside).ok());
  Put(outside + "/secret", "host secret\n");
  struct Case {
    const char* what;
    std::vector<TarEntry> entries;
  };
  std::vector<Case> cases = {
      {"dot-dot name", {{"a", 'd', ""}, {"a/../../escape", 'f', "x"}}},
      {"absolute name", {{"/etc/escape", 'f', "x"}}},
      {"symlink then a file through it", {{"evil", 'l', outside}, {"evil/planted", 'f', "x"}}},
      {"hard link to outside", {{"h", 'h', "../outside/secret"}}},
      {"hard link through a symlink", {{"evil", 'l', outside}, {"h", 'h', "evil/secret"}}},
      {"an id past 65535", {{"f", 'f', "x", 70000}}},
      {"a whiteout's name leaving", {{".wh..", 'f', ""}}},
  };
  for (const auto& c : cases) {
    auto r = AddBlob(c.entries);
    EXPECT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().err(), EINVAL) << c.what << ": " << r.status().message();
    EXPECT_EQ(r.status().message().find(ts_.dir), std::string::npos) << r.status().message();
    ExpectNothingLeft(c.what);
  }
  EXPECT_FALSE(Exists(outside + "/planted"));
  EXPECT_EQ(Ls(outside), std::vector<std::string>{"secret"});
  // Device nodes are dropped; the rest of the layer is kept.
  auto dev =
      AddBlob({{"dev", 'd', ""}, {"dev/sda", 'b', ""}, {"dev/tty9", 'c', ""}, {"ok", 'f', "1"}});
  ASSERT_TRUE(dev.ok()) << dev.status().message();
  EXPECT_FALSE(Exists(LayerDir(ts_, dev->id) + "/dev/sda"));
  EXPECT_FALSE(Exists(LayerDir(ts_, dev->id) + "/dev/tty9"));
  EXPECT_TRUE(Exists(LayerDir(ts_, dev->id) + "/ok"));
}

TEST_F(ImageTest, DigestMismatchesAndTruncatedBlobsAreEbadmsgAndLeaveNothing) {
  Layer l = MakeLayer({{"f", 'f', std::string(100000, 'x')}, {"g", 'f', "y"}}, "gzip");
  std::string path = dir_ + "/blob";
  Put(path, l.blob);
  std::string other = "sha256:" + std::string(64, '0');
  auto r = AddLayerFromBlob(ts_, *st_, path, other, "sha256:" + l.diff_hex, "");
  EXPECT_EQ(r.status().err(), EBADMSG) << r.status().message();
  ExpectNothingLeft("blob digest");
  r = AddLayerFromBlob(ts_, *st_, path, "sha256:" + l.blob_hex, other, "");
  EXPECT_EQ(r.status().err(), EBADMSG) << r.status().message();
  ExpectNothingLeft("diff_id");
  Put(path, l.blob.substr(0, l.blob.size() / 2));
  r = AddLayerFromBlob(ts_, *st_, path, "", "sha256:" + l.diff_hex, "");
  EXPECT_EQ(r.status().err(), EBADMSG) << r.status().message();
  ExpectNothingLeft("truncated");
  // An import whose layer blob was tampered with: refused, no template.
  std::string layout = Oci("tampered", {l}, json::object());
  Put(layout + "/blobs/sha256/" + l.blob_hex, Compress(MakeTar({{"f", 'f', "evil"}}), "gzip"));
  auto t = ImportImage(ts_, *st_, "tampered", layout, "", false);
  EXPECT_EQ(t.status().err(), EBADMSG) << t.status().message();
  EXPECT_FALSE(*st_->GetTemplate("tampered"));
  ExpectNothingLeft("tampered import");
}

TEST_F(ImageTest, TooBigForTheCacheIsEnospcAndLeavesNothing) {
  ts_.cache_bytes = 64 << 10;
  auto r = AddBlob({{"big", 'f', std::string(1 << 20, 'z')}});
  EXPECT_EQ(r.status().err(), ENOSPC) << r.status().message();
  ExpectNothingLeft("enospc");
}

// A layer that cannot fit even with every unused layer gone evicts none of them.
TEST_F(ImageTest, ALayerTooBigForTheCacheEvictsNothing) {
  ts_.cache_bytes = 64 << 10;
  auto unused = AddBlob({{"small", 'f', "s"}});
  ASSERT_TRUE(unused.ok()) << unused.status().message();
  auto stage = MakeStagingDir(ts_);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  Put(*stage + "/big", std::string(1 << 20, 'z'));
  auto r = AddLayerFromDir(ts_, *st_, *stage, "snap-big", std::nullopt, "");
  EXPECT_EQ(r.status().err(), ENOSPC) << r.status().message();
  EXPECT_TRUE(Exists(LayerDir(ts_, unused->id)));
  EXPECT_TRUE(*st_->GetLayer(unused->id));
}

// A layer charged to a key counts against the key's bound (its layers in use): one that would
// pass it is refused before anything is evicted, and its directory is left to the caller.
TEST_F(ImageTest, ALayerChargedToAKeyStaysWithinItsBound) {
  auto unused = AddBlob({{"small", 'f', "s"}});
  ASSERT_TRUE(unused.ok()) << unused.status().message();
  const LayerCharge charge{"key_saver", 3 << 20};
  auto stage = MakeStagingDir(ts_);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  Put(*stage + "/a", std::string(2 << 20, 'a'));
  auto first = AddLayerFromDir(ts_, *st_, *stage, "snap-first", std::nullopt, "sb1", charge);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->owner_key_id, "key_saver");
  EXPECT_EQ(*st_->LayerBytesOwnedBy("key_saver"), first->size_bytes);
  // Room for one more such layer once the unused one is evicted, and not before.
  ts_.cache_bytes = 2 * first->size_bytes + unused->size_bytes / 2;

  stage = MakeStagingDir(ts_);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  Put(*stage + "/b", std::string(2 << 20, 'b'));
  auto second = AddLayerFromDir(ts_, *st_, *stage, "snap-second", std::nullopt, "sb1", charge);
  EXPECT_EQ(second.status().err(), EDQUOT) << second.status().message();
  EXPECT_NE(second.status().message().find("key_saver"), std::string::npos);
  EXPECT_TRUE(Exists(*stage + "/b"));  // the caller's still
  EXPECT_FALSE(*st_->GetLayer("snap-second"));
  EXPECT_TRUE(*st_->GetLayer(unused->id));  // nothing evicted for it
  // Another key, or none, is not bound by it.
  auto other = AddLayerFromDir(ts_, *st_, *stage, "snap-other", std::nullopt, "sb1",
                               LayerCharge{"key_other", 3 << 20});
  ASSERT_TRUE(other.ok()) << other.status().message();
  // Once the first layer is no longer in use, the key has its room again.
  ASSERT_TRUE(st_->UnpinLayer("sb1", "snap-first").ok());
  stage = MakeStagingDir(ts_);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  Put(*stage + "/c", std::string(2 << 20, 'c'));
  EXPECT_TRUE(AddLayerFromDir(ts_, *st_, *stage, "snap-third", std::nullopt, "sb1", charge).ok());
}

// A layer's size counts what lies past PATH_MAX (a box's files may nest that deep: a count that
// skipped them would let it pin any amount of the cache), and a layer deeper than the copy of a
// writable layer allows is refused.
TEST_F(ImageTest, ALayersSizeCountsFilesPastPathMaxAndRefusesTooDeepATree) {
  auto nest = [&](const std::string& top, int depth, const std::string& name) {
    int fd = ::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (int i = 0; i < depth && fd >= 0; ++i) {
      EXPECT_EQ(::mkdirat(fd, name.c_str(), 0755), 0);
      int sub = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      ::close(fd);
      fd = sub;
    }
    return fd;
  };
  auto stage = MakeStagingDir(ts_);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  int bottom = nest(*stage, 40, std::string(200, 'd'));  // 8 KB of path
  ASSERT_GE(bottom, 0);
  int f = ::openat(bottom, "big", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(f, 0);
  const std::string data(3 << 20, 'b');
  ASSERT_EQ(::write(f, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  // Beside it, a sparse file counts its data, not its size (its copy keeps the holes).
  int sparse = ::openat(bottom, "sparse", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(sparse, 0);
  ASSERT_EQ(::ftruncate(sparse, int64_t{64} << 30), 0);
  ::close(sparse);
  ::close(f);
  ::close(bottom);
  auto r = AddLayerFromDir(ts_, *st_, *stage, "snap-long", std::nullopt, "");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GE(r->size_bytes, 3 << 20);
  EXPECT_LT(r->size_bytes, 4 << 20);

  stage = MakeStagingDir(ts_);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  bottom = nest(*stage, 600, "d");
  ASSERT_GE(bottom, 0);
  ::close(bottom);
  r = AddLayerFromDir(ts_, *st_, *stage, "snap-deep", std::nullopt, "");
  EXPECT_EQ(r.status().err(), ELOOP) << r.status().message();
  EXPECT_EQ(r.status().message().find(dir_), std::string::npos)  // a tenant reads it
      << r.status().message();
  EXPECT_FALSE(*st_->GetLayer("snap-deep"));
}

TEST_F(ImageTest, WhiteoutsBecomeOverlayfsWhiteoutsThatHideLowerFiles) {
  auto lower = AddBlob({{"etc", 'd', ""},
                        {"etc/gone", 'f', "deleted above\n"},
                        {"etc/kept", 'f', "kept\n"},
                        {"opaque", 'd', ""},
                        {"opaque/old", 'f', "hidden by the opaque dir\n"}});
  ASSERT_TRUE(lower.ok()) << lower.status().message();
  auto upper = AddBlob({{"etc", 'd', ""},
                        {"etc/.wh.gone", 'f', ""},
                        {"opaque", 'd', ""},
                        {"opaque/.wh..wh..opq", 'f', ""},
                        {"opaque/new", 'f', "new\n"}},
                       "zstd");
  ASSERT_TRUE(upper.ok()) << upper.status().message();
  std::string u = LayerDir(ts_, upper->id), l = LayerDir(ts_, lower->id);
  struct stat sb {};
  ASSERT_EQ(::lstat((u + "/etc/gone").c_str(), &sb), 0);
  EXPECT_TRUE(S_ISCHR(sb.st_mode));
  EXPECT_EQ(sb.st_rdev, makedev(0, 0));
  EXPECT_FALSE(Exists(u + "/etc/.wh.gone"));
  EXPECT_FALSE(Exists(u + "/opaque/.wh..wh..opq"));
  // The opaque mark under both prefixes, and the layer says so.
  for (const char* name : {"trusted.overlay.opaque", "user.overlay.opaque"}) {
    char v[8] = {};
    ASSERT_EQ(::getxattr((u + "/opaque").c_str(), name, v, sizeof v), 1) << name;
    EXPECT_EQ(v[0], 'y');
  }
  char v[8] = {};
  EXPECT_GT(::getxattr(u.c_str(), "trusted.sbx.marks", v, sizeof v), 0);

  // A real overlay of the two, in a private mount namespace of a child: mounted by the host
  // (trusted.overlay.*, a vm guest's root), and in a user namespace (userxattr: user.overlay.*,
  // every other box's).
  std::string mnt = dir_ + "/mnt";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  for (bool userns : {false, true}) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (::unshare(CLONE_NEWNS | (userns ? CLONE_NEWUSER : 0)) != 0) ::_exit(10);
      if (userns && (!WriteFile("/proc/self/setgroups", "deny", 0644).ok() ||
                     !WriteFile("/proc/self/uid_map", "0 0 1", 0644).ok() ||
                     !WriteFile("/proc/self/gid_map", "0 0 1", 0644).ok()))
        ::_exit(10);
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(11);
      std::string opts = std::string(userns ? "userxattr," : "") + "lowerdir=" + u + ":" + l;
      if (::mount("overlay", mnt.c_str(), "overlay", MS_RDONLY, opts.c_str()) != 0) ::_exit(12);
      struct stat s {};
      if (::lstat((mnt + "/etc/gone").c_str(), &s) == 0) ::_exit(13);
      if (::lstat((mnt + "/etc/kept").c_str(), &s) != 0) ::_exit(14);
      if (::lstat((mnt + "/opaque/old").c_str(), &s) == 0) ::_exit(15);
      if (::lstat((mnt + "/opaque/new").c_str(), &s) != 0) ::_exit(16);
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << (userns ? "in a user namespace: " : "")
        << "10-12: mount, 13: whiteout shown, 14: kept file gone, 15: opaque dir shows lower, "
           "16: new file gone";
  }
}

// A box's layer marks a directory it replaced under user.overlay.* (its overlay's, in its user
// namespace): added to the cache, the mark is under trusted.overlay.* too. A layer an older sbx
// made with one mark gets the other the first time a box uses it.
TEST_F(ImageTest, OpaqueDirectoriesAreMarkedForEveryKindOfMount) {
  auto marks = [](const std::string& dir) {
    std::string out;
    for (const char* name : {"trusted.overlay.opaque", "user.overlay.opaque"}) {
      char v[8] = {};
      out += ::getxattr(dir.c_str(), name, v, sizeof v) == 1 && v[0] == 'y' ? "y" : "-";
    }
    return out;
  };
  auto stage = MakeStagingDir(ts_);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  ASSERT_EQ(::mkdir((*stage + "/replaced").c_str(), 0755), 0);
  ASSERT_EQ(::setxattr((*stage + "/replaced").c_str(), "user.overlay.opaque", "y", 1, 0), 0);
  ASSERT_EQ(::mkdir((*stage + "/plain").c_str(), 0755), 0);
  // 6.7+: "x" is a directory that may hold xattr whiteouts, not an opaque one.
  ASSERT_EQ(::setxattr((*stage + "/plain").c_str(), "user.overlay.opaque", "x", 1, 0), 0);
  auto r = AddLayerFromDir(ts_, *st_, *stage, "snap-marks", std::nullopt, "");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string snap = LayerDir(ts_, "snap-marks");
  EXPECT_EQ(marks(snap + "/replaced"), "yy");
  EXPECT_EQ(marks(snap + "/plain"), "--");

  auto img = AddBlob({{"o", 'd', ""}, {"o/.wh..wh..opq", 'f', ""}, {"o/n", 'f', "n"}});
  ASSERT_TRUE(img.ok()) << img.status().message();
  const std::string old = LayerDir(ts_, img->id);
  // As an older sbx left them: one mark each, and no word that both are there.
  ASSERT_EQ(::removexattr((old + "/o").c_str(), "user.overlay.opaque"), 0);
  ASSERT_EQ(::removexattr(old.c_str(), "trusted.sbx.marks"), 0);
  ASSERT_EQ(::removexattr((snap + "/replaced").c_str(), "trusted.overlay.opaque"), 0);
  ASSERT_EQ(::removexattr(snap.c_str(), "trusted.sbx.marks"), 0);
  auto t = TemplateOfLayers(ts_, {"snap-marks", img->id});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(marks(old + "/o"), "yy");
  EXPECT_EQ(marks(snap + "/replaced"), "yy");
  EXPECT_EQ(marks(snap + "/plain"), "--");
  char v[8] = {};
  EXPECT_GT(::getxattr(old.c_str(), "trusted.sbx.marks", v, sizeof v), 0);
  EXPECT_GT(::getxattr(snap.c_str(), "trusted.sbx.marks", v, sizeof v), 0);
}

TEST_F(ImageTest, LayersAreUnreachableByHostUsers) {
  auto r = AddBlob({{"bin", 'd', "", 0, 0755}, {"bin/su", 'f', "x", 0, 04755}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::string su = LayerDir(ts_, r->id) + "/bin/su";
  struct stat sb {};
  ASSERT_EQ(::lstat(su.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 04755u);  // kept for the box
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    struct stat s {};
    ::_exit(::stat(su.c_str(), &s) == 0 ? 1 : (errno == EACCES ? 0 : 2));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(ImageTest, OneDigestIsUnpackedOnceEvenByConcurrentImports) {
  Layer l = MakeLayer({{"f", 'f', std::string(1 << 20, 'q')}}, "gzip");
  std::string path = dir_ + "/blob";
  Put(path, l.blob);
  std::vector<Result<store::LayerRecord>> results(4, Status::Error("not run", EIO));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] {
      results[i] =
          AddLayerFromBlob(ts_, *st_, path, "sha256:" + l.blob_hex, "sha256:" + l.diff_hex, "");
    });
  for (auto& t : threads) t.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->id, "sha256-" + l.diff_hex);
  }
  EXPECT_EQ(Ls(ts_.dir + "/layers"), std::vector<std::string>{"sha256-" + l.diff_hex});
  EXPECT_TRUE(Ls(ts_.dir + "/staging").empty());
  // A later import of it is a no-op that only pins it.
  ASSERT_TRUE(
      AddLayerFromBlob(ts_, *st_, path, "sha256:" + l.blob_hex, "sha256:" + l.diff_hex, "").ok());
  EXPECT_EQ(st_->ListLayers()->size(), 1u);
}

TEST_F(ImageTest, PinsOfABuildHoldWhileItsLeaseIsHeldAndGoWhenItsMakerDies) {
  {
    auto lease = PinLease::Take(ts_, *st_, "bld_alive");
    ASSERT_TRUE(lease.ok()) << lease.status().message();
    auto r = AddBlob({{"a", 'f', "1"}}, "gzip", lease->id());
    ASSERT_TRUE(r.ok()) << r.status().message();
    auto gc = GcLayers(ts_, *st_);
    ASSERT_TRUE(gc.ok());
    EXPECT_TRUE(gc->empty());  // pinned by a held lease
    EXPECT_TRUE(Exists(LayerDir(ts_, r->id)));
  }  // released: unpinned
  auto gc = GcLayers(ts_, *st_);
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(gc->size(), 1u);
  EXPECT_TRUE(Ls(ts_.dir + "/layers").empty());

  // A maker killed mid-build: its lease dies with it, and so do its pins at the next sweep; so
  // does its staging directory.
  EXPECT_EQ(PinLease::Take(ts_, *st_, "sb_not_a_build").status().err(), EINVAL);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto child_store = store::Store::Open(dir_ + "/sbx.db");
    if (!child_store.ok()) ::_exit(10);
    auto lease = PinLease::Take(ts_, **child_store, "bld_killed");
    if (!lease.ok()) ::_exit(11);
    Layer l = MakeLayer({{"b", 'f', "2"}});
    std::string path = dir_ + "/child-blob";
    if (!WriteFile(path, l.blob, 0600).ok()) ::_exit(12);
    if (!AddLayerFromBlob(ts_, **child_store, path, "", "sha256:" + l.diff_hex, lease->id()).ok())
      ::_exit(13);
    if (!MakeStagingDir(ts_).ok()) ::_exit(14);
    ::_exit(0);  // no destructor runs: as if killed
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(Ls(ts_.dir + "/layers").size(), 1u);
  EXPECT_EQ(Ls(ts_.dir + "/staging").size(), 1u);
  gc = GcLayers(ts_, *st_);
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(gc->size(), 1u);
  EXPECT_TRUE(Ls(ts_.dir + "/layers").empty());
  EXPECT_TRUE(Ls(ts_.dir + "/staging").empty());
  EXPECT_TRUE(Ls(ts_.dir + "/leases").empty());
}

TEST_F(ImageTest, ABuildStepsDirectoryBecomesALayerWithItsOwnersShiftedDown) {
  const uint32_t base = 200000;
  auto stage = MakeStagingDir(ts_);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  std::string d = *stage;
  ASSERT_EQ(::chown(d.c_str(), base, base), 0);
  ASSERT_EQ(::chmod(d.c_str(), 0755), 0);
  Put(d + "/root-file", "r");
  ASSERT_EQ(::chown((d + "/root-file").c_str(), base, base), 0);
  Put(d + "/user-suid", "u");
  ASSERT_EQ(::chown((d + "/user-suid").c_str(), base + 1000, base + 1000), 0);
  ASSERT_EQ(::chmod((d + "/user-suid").c_str(), 06755), 0);
  Put(d + "/foreign", "f");
  ASSERT_EQ(::chown((d + "/foreign").c_str(), 1234, 1234), 0);
  ASSERT_EQ(::mknod((d + "/deleted").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  ASSERT_EQ(::mkdir((d + "/opq").c_str(), 0755), 0);
  ASSERT_EQ(::setxattr((d + "/opq").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  ASSERT_EQ(::setxattr((d + "/opq").c_str(), "trusted.overlay.origin", "zz", 2, 0), 0);
  ASSERT_EQ(::symlink("/etc/passwd", (d + "/link").c_str()), 0);
  ASSERT_EQ(::lchown((d + "/link").c_str(), base, base), 0);

  auto lease = PinLease::Take(ts_, *st_, "bld_step");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(AddLayerFromDir(ts_, *st_, d, "sha256-x", base, lease->id()).status().err(), EINVAL);
  auto r = AddLayerFromDir(ts_, *st_, d, "build-0123abcd", base, lease->id());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(Exists(d));  // consumed
  std::string l = LayerDir(ts_, "build-0123abcd");
  struct stat sb {};
  ASSERT_EQ(::lstat(l.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 0u);
  ASSERT_EQ(::lstat((l + "/root-file").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 0u);
  ASSERT_EQ(::lstat((l + "/user-suid").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 1000u);
  EXPECT_EQ(sb.st_gid, 1000u);
  EXPECT_EQ(sb.st_mode & 07777, 06755u);
  ASSERT_EQ(::lstat((l + "/foreign").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 65534u);
  ASSERT_EQ(::lstat((l + "/deleted").c_str(), &sb), 0);
  EXPECT_TRUE(S_ISCHR(sb.st_mode));
  ASSERT_EQ(::lstat((l + "/link").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 0u);
  char v[8] = {};
  EXPECT_EQ(::getxattr((l + "/opq").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_LT(::getxattr((l + "/opq").c_str(), "trusted.overlay.origin", v, sizeof v), 0);
  EXPECT_GT(r->size_bytes, 0);

  // A template of it and a base layer, with a build's config.
  auto b = AddBlob({{"etc", 'd', ""}}, "gzip", lease->id());
  ASSERT_TRUE(b.ok());
  ImageConfig cfg;
  cfg.env = {"A=1"};
  cfg.user = "app";
  EXPECT_EQ(PutImageTemplate(ts_, *st_, "built", store::kTemplateBuild, "Dockerfile",
                             {"build-0123abcd", "missing"}, cfg, false)
                .status()
                .err(),
            ENOENT);
  auto t = PutImageTemplate(ts_, *st_, "built", store::kTemplateBuild, "Dockerfile",
                            {"build-0123abcd", b->id}, cfg, false);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->kind, store::kTemplateBuild);
  EXPECT_EQ(t->size_bytes, r->size_bytes + b->size_bytes);
  EXPECT_EQ(PutImageTemplate(ts_, *st_, "built", store::kTemplateBuild, "", {b->id}, cfg, false)
                .status()
                .err(),
            EEXIST);
  EXPECT_EQ(PutImageTemplate(ts_, *st_, "host", store::kTemplateBuild, "", {b->id}, cfg, true)
                .status()
                .err(),
            EPERM);
  EXPECT_EQ(GetImageConfig(*st_, "built")->user, "app");
  lease->Release();
  EXPECT_TRUE(GcLayers(ts_, *st_)->empty());  // the template holds both
}

TEST_F(ImageTest, ImageConfigRoundTripsThroughJson) {
  ImageConfig c;
  c.env = {"A=1", "B=x=y"};
  c.user = "1000:1000";
  c.workdir = "/w";
  c.entrypoint = {"/bin/sh", "-c"};
  c.cmd = {"echo hi"};
  c.exposed_ports = {"80/tcp"};
  c.labels = {{"k", "v"}};
  auto back = ImageConfigFromJson(ImageConfigToJson(c));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->env, c.env);
  EXPECT_EQ(back->user, c.user);
  EXPECT_EQ(back->workdir, c.workdir);
  EXPECT_EQ(back->entrypoint, c.entrypoint);
  EXPECT_EQ(back->cmd, c.cmd);
  EXPECT_EQ(back->exposed_ports, c.exposed_ports);
  EXPECT_EQ(back->labels, c.labels);
  EXPECT_EQ(ImageConfigToJson(ImageConfig{}), "{}");
  EXPECT_EQ(ImageConfigFromJson(R"({"env":"A=1"})").status().err(), EINVAL);
  Template t;
  t.env = {"PATH=/bin", "LANG=C.UTF-8"};
  ApplyImageConfig(c, &t);
  EXPECT_EQ(t.env, (std::vector<std::string>{"PATH=/bin", "LANG=C.UTF-8", "A=1", "B=x=y"}));
  ApplyImageConfig(ImageConfig{}, &t);
  EXPECT_EQ(t.user, "root");
}

}  // namespace
}  // namespace sbx::storage
