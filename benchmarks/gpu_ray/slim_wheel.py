"""A wheel less the members a glob names, its RECORD rewritten to match (pip installs what the
RECORD lists and checks each file's hash; a member gone from the zip must be gone from it too).
The members are stored, not deflated: pack.sh compresses the whole stream with xz, which takes Ray's
binaries to about 70% of what deflate gives (28.5 MB against 40.5 MB for the slim Ray wheel).

    python benchmarks/gpu_ray/slim_wheel.py IN.whl OUT.whl 'ray/jars/*' 'ray/rllib/*' ...

Prints the bytes before and after and how many members went. Used by benchmarks/gpu_ray/pack.sh.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import zipfile


def slim(src: str, dst: str, patterns: list[str]) -> tuple[int, int]:
    gone = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        dropped = {i.filename for i in zin.infolist() if any(fnmatch.fnmatch(i.filename, p) for p in patterns)}
        for info in zin.infolist():
            if info.filename in dropped:
                gone += 1
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(x for x in lines if x.split(",", 1)[0] not in dropped).encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_STORED)  # info keeps the mode bits
    return gone, len(dropped)


def main() -> None:
    src, dst, *patterns = sys.argv[1:]
    gone, _ = slim(src, dst, patterns)
    print(f"{os.path.basename(src)}: {os.path.getsize(src):,} -> {os.path.getsize(dst):,} bytes, {gone} members dropped")


if __name__ == "__main__":
    main()
