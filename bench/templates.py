"""The template rows (issue 13, item 8), each beside a peer measured in the same run:

  - pull and unpack of an image (a Debian root of a few layers, ~100 MB compressed) from Debian's
    docker-registry on 127.0.0.1: `sbx template pull` versus `skopeo copy` + `umoci unpack` of
    the same image, cold (an empty store / an empty OCI layout) and warm (the layers already
    there: sbx's layer store holds them, skopeo's destination layout holds the blobs);
  - create to first command through the REST API on a template just imported (its layers freshly
    unpacked, never used by a box) versus on a template already used;
  - `sbx build` of a Dockerfile with every step cached versus the first build of it (`--no-cache`,
    every step run), and `docker build` when a docker daemon is there.

The image is built once and kept in the build directory (bench/templates-image): a root made with
mmdebstrap from the Debian mirror the host uses (the host's /usr subset when mmdebstrap cannot
run), cut into layers by path, plus an application layer generated here. Everything else (the
registry and its storage, data directories, layouts, bundles) lives in the run's temporary
directory and is removed at the end, also when a step fails.

The rows' files live on a scratch ext4 filesystem the section makes (a sparse image in the run's
temporary directory, loop-mounted without `discard`, unmounted and removed at the end): on a host
whose root filesystem is mounted with `discard` (this one's is), every file removed issues a
synchronous discard, and clearing an unpacked root of 12,000 files between rounds would take
minutes. Nothing is removed between rounds at all: each round writes to new directories, so a
round never waits on (or competes with) the removal of the previous one.
"""

import hashlib
import io
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time

import daemon as daemon_mod
import peers as peers_mod
from stats import ratio, summarize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bump when the image's recipe changes, so that a cached image of the old recipe is rebuilt.
IMAGE_VERSION = "1"
TAG = "bench"
SUITE = "bookworm"
INCLUDE = "python3,git,ca-certificates"
LIMITS = {"memory_bytes": peers_mod.MEMORY_BYTES, "pids": peers_mod.PIDS}

FULL = {"pull_rounds": 6, "create_rounds": 8, "used_per_round": 10, "build_rounds": 6}
QUICK = {"pull_rounds": 2, "create_rounds": 2, "used_per_round": 5, "build_rounds": 2}
SCRATCH_BYTES = 40 << 30  # sparse: only what the rows write is allocated (~15 GB for FULL)

DOCKERFILE = """\
FROM bench-base
ARG APP=/opt/app
ENV APP_HOME=$APP LANG=C.UTF-8
WORKDIR $APP
COPY app/ $APP/
RUN python3 -m compileall -q $APP && mkdir -p /var/lib/bench \\
    && tar -cf /var/lib/bench/doc.tar -C /usr/share doc && git --version > /var/lib/bench/git
RUN python3 -c "import app_0000; print(app_0000.VALUE)" > /var/lib/bench/value
LABEL org.opencontainers.image.title=bench-app
CMD ["python3", "-c", "import app_0000"]
"""


def _sh(argv, timeout=600, env=None, cwd=None):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: "
                           f"{' '.join((p.stderr or p.stdout).split())[-500:]}")
    return p


def _timed(argv, timeout=900, env=None):
    """Seconds one command takes (the interpreter's fork is noise at this scale)."""
    t0 = time.monotonic()
    _sh(argv, timeout=timeout, env=env)
    return time.monotonic() - t0


def _cpu():
    """CPU seconds (user + system) of the waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _version(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return (p.stdout or p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


# ---- the image ----


def _layer_of(name):
    """Layer index of a root member by path (0 base, 1 /usr/share, 2 Python and git)."""
    n = name.lstrip("./")
    if n.startswith("usr/share/"):
        return 1
    if n.startswith(("usr/lib/python3", "usr/lib/git-core")):
        return 2
    return 0


def _app_layer(path):
    """An application layer: 800 small Python modules and 16 MiB of incompressible data."""
    rnd = random.Random(13)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        def add(name, data, mode=0o644):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), mode, 0
            t.addfile(ti, io.BytesIO(data))
        for d in ("opt", "opt/app-base"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
            t.addfile(ti)
        for i in range(800):
            body = "".join(f"def f{j}(x):\n    return x * {rnd.randint(1, 999)} + {j}\n\n"
                           for j in range(40))
            add(f"opt/app-base/mod_{i:04d}.py", body.encode())
        add("opt/app-base/blob.bin", rnd.randbytes(16 << 20))


def _root_tar(path, log):
    """A Debian root as a tarball: mmdebstrap, else the host's /usr subset. Returns its source."""
    if shutil.which("mmdebstrap"):
        log(f"templates: making the image's root with mmdebstrap ({SUITE}, minbase + {INCLUDE}); "
            "once, kept in the build directory")
        p = subprocess.run(["mmdebstrap", "--variant=minbase", f"--include={INCLUDE}",
                            "--mode=root", "--quiet", SUITE, path], capture_output=True, text=True,
                           timeout=1800)
        if p.returncode == 0:
            return f"mmdebstrap --variant=minbase --include={INCLUDE} {SUITE}"
        log(f"templates: mmdebstrap failed ({' '.join(p.stderr.split())[-300:]}); using the "
            "host's /usr subset instead")
    dirs = [d for d in ("usr/bin", "usr/sbin", "usr/lib/python3", "usr/lib/python3.11",
                        "usr/lib/git-core", "usr/share/perl", "usr/share/zoneinfo",
                        "usr/share/ca-certificates", "usr/lib/x86_64-linux-gnu/perl-base")
            if os.path.isdir("/" + d)]
    _sh(["tar", "-C", "/", "--numeric-owner", "-cf", path, *dirs], timeout=1800)
    return "tar of the host's " + ", ".join("/" + d for d in dirs)


def _split(root_tar, outs):
    """Writes the root's members into the layer tarballs `outs` by path. Directories go to the
    base layer (so every parent exists below the layers that fill it), a hard link goes to the
    layer of its target."""
    where = {}
    tars = [tarfile.open(o, "w", format=tarfile.PAX_FORMAT) for o in outs]
    try:
        with tarfile.open(root_tar, "r") as src:
            for m in src:
                name = m.name.lstrip("./")
                if not name:
                    continue
                if m.isdir():
                    i = 0
                elif m.islnk():
                    i = where.get(m.linkname.lstrip("./"), 0)
                else:
                    i = _layer_of(name)
                where[name] = i
                tars[i].addfile(m, src.extractfile(m) if m.isreg() else None)
    finally:
        for t in tars:
            t.close()


def _blob(layout, data_path=None, data=None):
    """Adds a blob to the layout's blobs/sha256; returns (digest, size)."""
    h = hashlib.sha256()
    if data is not None:
        h.update(data)
        size = len(data)
    else:
        size = os.path.getsize(data_path)
        with open(data_path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    d = h.hexdigest()
    dst = os.path.join(layout, "blobs", "sha256", d)
    if data is not None:
        with open(dst, "wb") as f:
            f.write(data)
    else:
        os.replace(data_path, dst)
    return "sha256:" + d, size


def ensure_image(build_dir, log):
    """The OCI layout of the benchmark image (made once per build directory); returns its path
    and a description."""
    base = os.path.join(build_dir, "bench", "templates-image")
    layout = os.path.join(base, f"layout-v{IMAGE_VERSION}")
    meta = os.path.join(layout, "bench.json")
    if os.path.exists(meta):
        with open(meta) as f:
            return layout, json.load(f)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    work = tempfile.mkdtemp(prefix="make-", dir=base)
    stage = os.path.join(work, "layout")
    os.makedirs(os.path.join(stage, "blobs", "sha256"))
    root = os.path.join(work, "root.tar")
    source = _root_tar(root, log)
    names = ["base", "usr-share", "python-git"]
    raws = [os.path.join(work, f"{n}.tar") for n in names]
    _split(root, raws)
    os.unlink(root)
    names.append("app")
    raws.append(os.path.join(work, "app.tar"))
    _app_layer(raws[-1])
    layers, diff_ids, desc = [], [], []
    for n, raw in zip(names, raws):
        h = hashlib.sha256()
        with open(raw, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        diff_ids.append("sha256:" + h.hexdigest())
        usize = os.path.getsize(raw)
        gz = raw + ".gz"
        with open(raw, "rb") as src, open(gz, "wb") as out:
            subprocess.run(["gzip", "-6", "-n", "-c"], stdin=src, stdout=out, check=True)
        os.unlink(raw)
        digest, size = _blob(stage, data_path=gz)
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                       "digest": digest, "size": size})
        desc.append({"name": n, "bytes": size, "unpacked_bytes": usize})
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                           "LANG=C.UTF-8"], "Cmd": ["/bin/bash"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": f"sbx bench: {n} layer"} for n in names],
    }
    cdigest, csize = _blob(stage, data=json.dumps(config, sort_keys=True).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": cdigest, "size": csize}, "layers": layers}
    mdigest, msize = _blob(stage, data=json.dumps(manifest, sort_keys=True).encode())
    with open(os.path.join(stage, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest,
            "size": msize, "annotations": {"org.opencontainers.image.ref.name": TAG}}]}, f)
    with open(os.path.join(stage, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    info = {"source": source, "layers": desc, "manifest": mdigest,
            "bytes": sum(d["bytes"] for d in desc),
            "unpacked_bytes": sum(d["unpacked_bytes"] for d in desc)}
    with open(os.path.join(stage, "bench.json"), "w") as f:
        json.dump(info, f, indent=1)
    os.rename(stage, layout)
    shutil.rmtree(work, ignore_errors=True)
    return layout, info


# ---- the registry ----


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Registry:
    """Debian's docker-registry on 127.0.0.1:<free port>, its storage in `dir`."""

    def __init__(self, dir):
        self.dir = dir
        self.proc = None
        self.port = None
        self.log = None

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        self.log = open(os.path.join(self.dir, "log"), "ab")
        for _ in range(5):
            port = _free_port()
            cfg = os.path.join(self.dir, "config.yml")
            with open(cfg, "w") as f:
                f.write("version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
                        f"storage:\n  filesystem:\n    rootdirectory: {self.dir}/data\n"
                        f"http:\n  addr: 127.0.0.1:{port}\n")
            self.proc = subprocess.Popen(["docker-registry", "serve", cfg], stdout=self.log,
                                         stderr=self.log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
            deadline = time.time() + 30
            while time.time() < deadline and self.proc.poll() is None:
                if _listening(port):
                    self.port = port
                    return
                time.sleep(0.05)
            self.stop()  # another process took the port between the probe and the bind: again
        with open(os.path.join(self.dir, "log"), errors="replace") as f:
            raise RuntimeError("docker-registry did not start: " + " ".join(f.read().split())[-300:])

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self):
        self.stop()
        if self.log:
            self.log.close()


class Scratch:
    """An ext4 filesystem in a sparse image, loop-mounted without discard (see the module's
    docstring); `close` unmounts it and removes the image, whatever is inside."""

    def __init__(self, tmp):
        self.image = os.path.join(tmp, "templates-scratch.img")
        self.mnt = os.path.join(tmp, "templates")
        self.mounted = False

    def open(self):
        with open(self.image, "wb") as f:
            f.truncate(SCRATCH_BYTES)
        _sh(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
             self.image])
        os.makedirs(self.mnt, exist_ok=True)
        _sh(["mount", "-o", "loop,nodiscard", self.image, self.mnt])
        self.mounted = True
        os.chmod(self.mnt, 0o711)

    def close(self):
        notes = []
        if self.mounted:
            p = subprocess.run(["umount", self.mnt], capture_output=True, text=True)
            if p.returncode != 0:  # something still holds it: detach, the loop device follows
                notes.append(f"umount: {p.stderr.strip()[-200:]}; detached lazily")
                subprocess.run(["umount", "-l", self.mnt], capture_output=True)
            self.mounted = False
        try:
            os.unlink(self.image)
        except OSError:
            pass
        return notes


# ---- the rows ----


class TemplateBench:
    def __init__(self, build_dir, tmp, pid, log, cfg):
        self.build = build_dir
        self.sbx = os.path.join(build_dir, "sbx")
        self.log = log
        self.cfg = cfg
        self.scratch = Scratch(tmp)
        self.dir = self.scratch.mnt
        self.pid = pid
        self.seq = 0
        self.registry = Registry(os.path.join(self.dir, "registry"))
        self.cgroup_parent = f"sbx-bench-{pid}-tmpl"
        # The boxes of `sbx build` and of the daemon go below this cgroup (run.py removes it).
        self.env = dict(os.environ, SBX_CGROUP_PARENT=self.cgroup_parent, HOME=self.dir,
                        TMPDIR=self.dir)
        self.daemon = None
        self.ref = None

    def sbx_argv(self, data, *args):
        return [self.sbx, "--data-dir", data, *args]

    def open(self, layout):
        self.scratch.open()
        self.registry.start()
        self.ref = f"127.0.0.1:{self.registry.port}/bench/debian:{TAG}"
        _sh(["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
             f"oci:{layout}:{TAG}", f"docker://{self.ref}"], env=self.env)

    def stop_daemon(self):
        notes = []
        if self.daemon is not None and self.daemon.proc is not None:
            try:
                n = self.daemon.stop()
                if n:
                    notes.append(n)
            except Exception as e:  # noqa: BLE001 (clean up the rest whatever happened)
                notes.append(f"stopping the daemon: {e}")
                if self.daemon.proc.poll() is None:
                    self.daemon.proc.kill()
                    self.daemon.proc.wait()
        self.daemon = None
        return notes

    def close(self):
        notes = self.stop_daemon()
        self.registry.close()
        return notes + self.scratch.close()

    def _fresh(self, name):
        """A new empty directory (never reused: nothing is removed between rounds)."""
        self.seq += 1
        d = os.path.join(self.dir, f"{name}-{self.seq}")
        os.makedirs(d, mode=0o711)
        return d

    # ---- 1. pull and unpack ----

    def sbx_pull(self, data, name):
        """Seconds of one `sbx template pull`: (total, fetch) where fetch ends when sbx says the
        blobs are in (its "sbx: pulled REF (DIGEST, N fetched)" line); the rest is unpacking and
        registering the template."""
        argv = self.sbx_argv(data, "template", "pull", "--replace", "--insecure-registry",
                             f"127.0.0.1:{self.registry.port}", name, self.ref)
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=self.env)
        fetched, tail = None, []
        for line in p.stderr:
            if fetched is None and line.startswith("sbx: pulled ") and " fetched)" in line:
                fetched = time.monotonic() - t0
            tail = (tail + [line.strip()])[-5:]
        p.wait()
        total = time.monotonic() - t0
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {' '.join(tail)[-500:]}")
        return total, fetched

    def peer_pull(self, layout, bundle):
        """skopeo copy to the OCI layout, then umoci unpack into a new bundle; (total, copy,
        unpack) seconds."""
        t_copy = _timed(["skopeo", "--insecure-policy", "copy", "--quiet",
                         "--src-tls-verify=false", f"docker://{self.ref}", f"oci:{layout}:{TAG}"],
                        env=self.env)
        t_unpack = _timed(["umoci", "unpack", "--image", f"{layout}:{TAG}", bundle], env=self.env)
        return t_copy + t_unpack, t_copy, t_unpack

    def run_pull(self):
        n = self.cfg["pull_rounds"]
        kinds = ["sbx_cold", "peer_cold", "sbx_warm", "peer_warm"]
        got = {k: [] for k in kinds}
        cpu = {k: [] for k in kinds}
        parts = {"peer_cold": {"copy": [], "unpack": []}, "peer_warm": {"copy": [], "unpack": []},
                 "sbx_cold": {"fetch": [], "unpack": []}, "sbx_warm": {"fetch": [], "unpack": []}}
        # Warm: a data directory that holds the image's layers, and a layout holding its blobs.
        warm_data = self._fresh("warm-data")
        self.sbx_pull(warm_data, "bench-warm")
        warm_layout = os.path.join(self._fresh("warm-oci"), "layout")
        _sh(["skopeo", "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
             f"docker://{self.ref}", f"oci:{warm_layout}:{TAG}"], env=self.env)
        for r in range(n):
            for k in kinds[r % 4:] + kinds[:r % 4]:  # rotate who goes first
                c0 = _cpu()
                if k.startswith("sbx"):
                    data = self._fresh("cold-data") if k == "sbx_cold" else warm_data
                    s, f = self.sbx_pull(data, "bench-cold" if k == "sbx_cold" else "bench-warm")
                    if f is not None:
                        parts[k]["fetch"].append(f)
                        parts[k]["unpack"].append(s - f)
                else:
                    if k == "peer_cold":
                        top = self._fresh("cold-oci")
                        layout = os.path.join(top, "layout")
                    else:
                        top = self._fresh("warm-bundle")
                        layout = warm_layout
                    s, c, u = self.peer_pull(layout, os.path.join(top, "bundle"))
                    parts[k]["copy"].append(c)
                    parts[k]["unpack"].append(u)
                got[k].append(s)
                cpu[k].append(_cpu() - c0)
                self.log(f"templates: pull round {r + 1}/{n}: {k.replace('_', ' ')}: {s:.2f} s "
                         f"({cpu[k][-1]:.2f} s of CPU)")
        res = {k: summarize(v) for k, v in got.items()}
        res["samples_s"] = got
        res["cpu_s"] = {k: summarize(v) for k, v in cpu.items()}
        res["parts_s"] = {k: {p: summarize(v) for p, v in d.items()} for k, d in parts.items()}
        res["ratios"] = {
            "cold: sbx / skopeo+umoci": _ratios(res["sbx_cold"], res["peer_cold"]),
            "warm: sbx / skopeo+umoci": _ratios(res["sbx_warm"], res["peer_warm"]),
            "sbx: warm / cold": _ratios(res["sbx_warm"], res["sbx_cold"]),
            "CPU seconds, cold: sbx / skopeo+umoci": _ratios(res["cpu_s"]["sbx_cold"],
                                                              res["cpu_s"]["peer_cold"]),
            "CPU seconds, warm: sbx / skopeo+umoci": _ratios(res["cpu_s"]["sbx_warm"],
                                                              res["cpu_s"]["peer_warm"]),
        }
        return res

    # ---- 2. first create from a new template versus from a used one ----

    def create_batch(self, template, runs):
        body = json.dumps({"template": template, "limits": LIMITS}, separators=(",", ":"))
        errdir = tempfile.mkdtemp(prefix="errs-", dir=self.dir)
        p = subprocess.run(self.daemon.client_argv("create-run", "-c", "1", "-n", str(runs),
                                                   "-e", errdir, body=body),
                           capture_output=True, text=True, timeout=900)
        ms, errors = [], []
        for line in p.stdout.splitlines():
            f = line.split()
            if len(f) != 9:
                continue
            if int(f[4]) == 0:
                ms.append(int(f[3]) / 1e6)
            else:
                try:
                    with open(os.path.join(errdir, f"{f[0]}-{f[1]}.err"), errors="replace") as e:
                        errors.append(" ".join(e.read().split())[:300])
                except OSError:
                    errors.append(f"status {f[4]}")
        shutil.rmtree(errdir, ignore_errors=True)
        if p.returncode != 0 and not errors:
            errors.append(f"sbx-bench-api exited {p.returncode}: {' '.join(p.stderr.split())[-300:]}")
        return ms, errors

    def run_create(self, layout):
        n, used_n = self.cfg["create_rounds"], self.cfg["used_per_round"]
        first, used, import_s, errors = [], [], [], []
        idmapped = None
        for r in range(n):
            # A daemon of its own per round, on a new data directory: the template's layers are
            # unpacked afresh by the import (no removal between rounds, see the docstring). The
            # daemon's own first box comes before (the warm-up on `host`), so that the first
            # create measures the template's first use, not the daemon's.
            self.daemon = daemon_mod.Daemon(self.build, self._fresh("create"), self.pid,
                                            name="sbx-serve", cgroup_parent=self.cgroup_parent)
            self.daemon.start()
            if self.daemon.error:
                raise RuntimeError(f"sbx serve: {self.daemon.error}")
            data = self.daemon.data
            # Warm-up: the daemon's first box (agent, cgroups) is not the template's first.
            self.create_batch("host", 2)
            name = "bench-new"
            t = _timed(self.sbx_argv(data, "template", "import", name, layout), env=self.env)
            import_s.append(t)
            ms, err = self.create_batch(name, 1)
            first += ms
            errors += err
            ms2, err = self.create_batch(name, used_n)
            used += ms2
            errors += err
            if r == 0:  # what the rows measured: idmapped layers, or shifted copies of them
                status, text = self.daemon.request("POST", "/v1/sandboxes",
                                                   {"template": name, "limits": LIMITS})
                if status == 201:
                    box = json.loads(text)
                    idmapped = box.get("idmapped")
                    self.daemon.request("DELETE", f"/v1/sandboxes/{box['id']}")
            notes = self.stop_daemon()
            if notes:
                errors += notes
            self.log(f"templates: create round {r + 1}/{n}: import {t:.2f} s, first create "
                     f"{ms[0] if ms else float('nan'):.1f} ms, used P50 "
                     f"{summarize(ms2)['p50'] or float('nan'):.1f} ms ({len(ms2)} runs)")
        res = {"first": summarize(first), "used": summarize(used), "import_s": summarize(import_s),
               "first_samples_ms": first, "used_samples_ms": used, "errors": errors[:10],
               "idmapped": idmapped}
        res["ratios"] = {"first / used": _ratios(res["first"], res["used"])}
        return res

    # ---- 3. cached rebuild versus the first build ----

    def _context(self):
        ctx = self._fresh("context")
        app = os.path.join(ctx, "app")
        os.makedirs(app)
        rnd = random.Random(8)
        for i in range(300):
            with open(os.path.join(app, f"app_{i:04d}.py"), "w") as f:
                f.write(f"VALUE = {rnd.randint(0, 1 << 30)}\n")
                for j in range(60):
                    f.write(f"def g{j}(x):\n    return (x + {rnd.randint(1, 99)}) * {j}\n\n")
        with open(os.path.join(app, "data.bin"), "wb") as f:
            f.write(rnd.randbytes(4 << 20))
        with open(os.path.join(ctx, "Dockerfile"), "w") as f:
            f.write(DOCKERFILE)
        return ctx

    def run_build(self, layout):
        data = self._fresh("build-data")
        ctx = self._context()
        _sh(self.sbx_argv(data, "template", "import", "bench-base", layout), env=self.env)
        n = self.cfg["build_rounds"]
        argv = self.sbx_argv(data, "build", "-t", "bench-app", ctx)
        _sh(argv, env=self.env)  # the first cached rebuild needs a build before it
        got = {"first": [], "cached": []}
        for r in range(n):
            for k in (["first", "cached"] if r % 2 == 0 else ["cached", "first"]):
                a = argv[:-1] + ["--no-cache", ctx] if k == "first" else argv
                t0 = time.monotonic()
                p = _sh(a, env=self.env)
                s = time.monotonic() - t0
                if k == "cached" and "Running in" in p.stdout + p.stderr:
                    raise RuntimeError("a cached rebuild ran a step: " + p.stdout[-500:])
                got[k].append(s)
                self.log(f"templates: build round {r + 1}/{n}: {k}: {s:.2f} s")
        # That the result runs: the template's CMD imports the app.
        _sh(self.sbx_argv(data, "run", "--template", "bench-app", "--", "python3", "-c",
                          "import app_0000"), env=self.env)
        res = {k: summarize(v) for k, v in got.items()}
        res["samples_s"] = got
        res["dockerfile"] = DOCKERFILE
        res["ratios"] = {"cached / first": _ratios(res["cached"], res["first"])}
        res["docker"] = self.docker_build(ctx, n)
        return res

    def docker_build(self, ctx, n):
        """`docker build` of the same Dockerfile when a docker daemon answers; else why not."""
        if not shutil.which("docker"):
            return {"error": "docker is not installed"}
        p = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            why = " ".join((p.stderr or p.stdout).split())[-300:]
            return {"error": f"the docker client ({shutil.which('docker')}) is installed but "
                    f"no docker daemon answers (`docker info`: {why}); dockerd is not "
                    "installed, and the benchmark does not start one (it would change the "
                    "host's firewall and routes)"}
        # A docker daemon is there: its image of the base is the benchmark image's.
        return {"error": "a docker daemon answers, but loading the base image into it is not "
                "implemented by this benchmark"}


def _ratios(a, b):
    return {q: ratio(a[q], b[q]) for q in ("p50", "p95")}


def run_templates(build_dir, tmp, pid, log, quick):
    """All the template rows; always returns a dict (with "error" when a step failed) and leaves
    no process or file of the run behind."""
    cfg = dict(QUICK if quick else FULL)
    t0 = time.time()
    res = {"config": cfg, "quick": quick,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
    with open("/proc/loadavg") as f:
        res["load_at_start"] = " ".join(f.read().split()[:3])
    res["versions"] = {
        "skopeo": _version(["skopeo", "--version"]),
        "umoci": _version(["umoci", "--version"]),
        "docker-registry": _version(["dpkg-query", "-W", "-f", "${Version}", "docker-registry"]),
    }
    tb = None
    try:
        layout, info = ensure_image(build_dir, log)
        res["image"] = info
        log(f"templates: image of {len(info['layers'])} layers, "
            f"{info['bytes'] / 1e6:.0f} MB compressed, {info['unpacked_bytes'] / 1e6:.0f} MB "
            f"unpacked ({info['source']})")
        tb = TemplateBench(build_dir, tmp, pid, log, cfg)
        tb.open(layout)
        for key, fn in (("pull", tb.run_pull), ("create", lambda: tb.run_create(layout)),
                        ("build", lambda: tb.run_build(layout))):
            try:
                res[key] = fn()
            except Exception as e:  # noqa: BLE001 (a failed row is reported, the others run)
                res[key] = {"error": f"{type(e).__name__}: {e}"}
                if key == "create" and tb.daemon is not None:
                    res[key]["daemon_log_tail"] = tb.daemon.log_tail(600)
                log(f"templates: {key}: {res[key]['error']}")
    except Exception as e:  # noqa: BLE001 (a failed section is reported, never fatal)
        res["error"] = f"{type(e).__name__}: {e}"
        log(f"templates: {res['error']}")
    finally:
        if tb is not None:
            notes = tb.close()
            if notes:
                res["cleanup_notes"] = notes
    with open("/proc/loadavg") as f:
        res["load_at_end"] = " ".join(f.read().split()[:3])
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    res["duration_s"] = round(time.time() - t0, 1)
    return res
