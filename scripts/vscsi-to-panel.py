#!/usr/bin/env python3
"""Convert a libCacheSim vscsi trace (the CloudPhysics traces: VSCSI1,
32-byte records, or VSCSI2, 40-byte records) into the policy panel's form,
so that `POLICY_PANEL_TRACES=DIR cargo bench -p tiercache-sim --bench
policy_panel` runs it beside the others:

    scripts/vscsi-to-panel.py RAW.vscsi DIR/NAME    # writes DIR/NAME/blocks.csv.zst

The panel's form is `time_us,offset_bytes,len_bytes,op` (op R or W), one
request per line in source order (`../shared/traces/README.md`). Records
whose SCSI command is neither a read nor a write are skipped, as
`tiercache sim` skips them (crates/sim/src/trace/vscsi.rs); times are made
relative to the first record. Needs `zstd` on the PATH.
"""

import os
import struct
import subprocess
import sys

READS = {0x08, 0x28, 0xA8, 0x88}
WRITES = {0x0A, 0x2A, 0xAA, 0x8A, 0x2E, 0xAE, 0x8E}


def version(data):
    """2 for VSCSI2, 1 for VSCSI1, from the version field of the first
    two records (its high byte)."""

    def ver_at(offset):
        return struct.unpack_from("<H", data, offset)[0] >> 8

    if len(data) >= 80 and ver_at(2) == 2 and ver_at(42) == 2:
        return 2
    if len(data) >= 64 and ver_at(14) == 1 and ver_at(46) == 1:
        return 1
    sys.exit("vscsi-to-panel: not a vscsi trace (no VSCSI1 or VSCSI2 version field)")


def records(data):
    v = version(data)
    size = 40 if v == 2 else 32
    if len(data) % size:
        sys.exit(f"vscsi-to-panel: {len(data)} bytes is not a whole number of {size}-byte records")
    for at in range(0, len(data), size):
        if v == 2:
            (cmd,) = struct.unpack_from("<H", data, at)
            (length,) = struct.unpack_from("<I", data, at + 8)
        else:
            (cmd,) = struct.unpack_from("<H", data, at + 12)
            (length,) = struct.unpack_from("<I", data, at + 4)
        lbn, ts_us = struct.unpack_from("<QQ", data, at + 16)
        op = "R" if cmd in READS else "W" if cmd in WRITES else None
        if op:
            yield ts_us, lbn * 512, length, op


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    raw, out_dir = argv[1], argv[2]
    with open(raw, "rb") as f:
        data = f.read()
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "blocks.csv")
    n, first = 0, None
    with open(csv_path, "w") as out:
        out.write("time_us,offset_bytes,len_bytes,op\n")
        for ts, offset, length, op in records(data):
            first = ts if first is None else first
            out.write(f"{ts - first},{offset},{length},{op}\n")
            n += 1
    subprocess.run(["zstd", "-q", "-f", "--rm", csv_path], check=True)
    print(f"{n} requests -> {csv_path}.zst")


if __name__ == "__main__":
    main(sys.argv)
