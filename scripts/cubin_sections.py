#!/usr/bin/env python3
"""cubin_sections.py — one line per kernel section of a cubin (ELF64): name, size, md5.

Checks that a refactor of a CUDA file leaves its machine code byte for byte the same
without cuobjdump (which the development machine lacks):

  nvcc -O3 -DNDEBUG -arch=sm_90a -cubin -lineinfo --expt-relaxed-constexpr -I src -I include \
       -o /tmp/before.cubin src/backend/cuda/gemm_w4ax.cu        # before the change
  ... the same into /tmp/after.cubin after it ...
  diff <(python3 scripts/cubin_sections.py /tmp/before.cubin) \
       <(python3 scripts/cubin_sections.py /tmp/after.cubin)

Sections compared: .text.<kernel> (the SASS), .nv.info.<kernel> (registers, barriers,
parameters), .nv.shared.<kernel> and .nv.constant0.<kernel>. The anonymous-namespace
prefix of a name depends on the file name, so it is dropped: a kernel moved to another
file still matches.
"""
import hashlib
import re
import struct
import sys

KINDS = ('.text.', '.nv.info.', '.nv.shared.', '.nv.constant0.')


def sections(path):
    d = open(path, 'rb').read()
    if d[:4] != b'\x7fELF' or d[4] != 2:
        sys.exit(f'{path}: not an ELF64 file (a cubin from nvcc -cubin)')
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3a)
    hdrs = [struct.unpack_from('<IIQQQQ', d, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdrs[shstrndx][4]
    for name_off, typ, _flags, _addr, off, size in hdrs:
        end = d.index(b'\0', strtab + name_off)
        name = d[strtab + name_off:end].decode()
        if name.startswith(KINDS):
            body = b'' if typ == 8 else d[off:off + size]  # SHT_NOBITS holds no bytes
            name = re.sub(r'\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}', '_GLOBAL__N_', name)
            yield name, size, hashlib.md5(body).hexdigest()


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for name, size, md5 in sorted(sections(sys.argv[1])):
        print(name, size, md5)
