"""On the device (benchmarks/gpu_ray/device_call.sh): unpack every stream whose pieces are all held,
check each wheel against .gpu/ray.SHA256SUMS, and install into SITE what the image lacks (or has
older than Ray or strict-gate needs); Ray itself always. Standard library only (the image's Python).

    python3 benchmarks/gpu_ray/install.py HOLD SITE .gpu/ray.SHA256SUMS .gpu/ray.PIECES

HOLD holds the pieces (rayNN) kept between calls; streams unpack into HOLD/x/<stream>/. Each
stream installs once (SITE/.<stream>_done). Prints what it unpacked, installed and left to the image.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

# the least version each needs (Ray's Requires-Dist, strict-gate's pyproject): an image copy older is replaced
MINIMUM = {"packaging": "24.2", "msgpack": "1.0.0", "protobuf": "3.20.3", "click": "7.0", "pyarrow": "19",
           "msgspec": "0.19", "jsonlines": "4"}
ALWAYS = {"ray"}  # installed whatever the image has


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:4])


def _image_versions(names: list[str]) -> dict[str, str | None]:
    """What the image itself has (without SITE on the path): name -> version or None."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: out[n] = None\nprint(json.dumps(out))")
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout)


def _sha(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main() -> int:
    hold, site, sums_path, pieces_path = map(Path, sys.argv[1:5])
    sums = {}
    for line in sums_path.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.strip()] = digest
    streams: dict[str, list[str]] = {}
    for line in pieces_path.read_text().splitlines():
        piece, stream = line.split()
        streams.setdefault(stream, []).append(piece)
    site.mkdir(parents=True, exist_ok=True)
    bad = 0
    for stream, pieces in streams.items():
        if (site / f".{stream}_done").exists():
            print(f"{stream}: installed in an earlier call")
            continue
        missing = [p for p in pieces if not (hold / p).exists()]
        if missing:
            print(f"{stream}: not yet (pieces {', '.join(missing)} not carried yet)")
            continue
        x = hold / "x" / stream
        x.mkdir(parents=True, exist_ok=True)
        cat = subprocess.Popen(["cat", *[str(hold / p) for p in pieces]], stdout=subprocess.PIPE)
        with tarfile.open(fileobj=cat.stdout, mode="r|xz") as tar:
            tar.extractall(x, filter="data")
        cat.wait()
        wheels = sorted(x.rglob("*.whl"))
        wrong = [w for w in wheels if sums.get(f"./{stream}/{w.relative_to(x)}") != _sha(w)]
        if wrong or not wheels:
            print(f"{stream}: UNPACKED WRONG (checksum): {[w.name for w in wrong] or 'no wheels'}")
            bad += 1
            continue
        names = {w: w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
        image = _image_versions(sorted(set(names.values())))
        take, left = [], []
        for w, n in names.items():
            have = image.get(n)
            need = MINIMUM.get(n)
            if n in ALWAYS or have is None or (need and _version_tuple(have) < _version_tuple(need)):
                take.append(w)
            else:
                left.append(f"{n} {have}")
        if take:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                                "--target", str(site), *map(str, take)], capture_output=True, text=True)
            noise = ("as the 'root' user", "already exists", "Target directory")
            print("\n".join(x for x in (r.stdout + r.stderr).splitlines() if not any(s in x for s in noise))[-2000:])
            if r.returncode != 0:
                print(f"{stream}: pip install FAILED rc={r.returncode}")
                bad += 1
                continue
        (site / f".{stream}_done").touch()
        print(f"{stream}: installed into {site}: {', '.join(sorted(w.name.split('-')[0] + ' ' + w.name.split('-')[1] for w in take)) or 'nothing'}")
        print(f"{stream}: the image's own kept: {', '.join(sorted(left)) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
