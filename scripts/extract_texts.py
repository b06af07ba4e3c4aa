#!/usr/bin/env python3
"""extract_texts.py — plain-text novels for comet's accuracy work, from Debian's R data packages.

Jane Austen's six novels come from `r-cran-janeaustenr`, Moby Dick from `r-cran-tokenizers`.
R is NOT needed: the packages are fetched with `apt-get download`, unpacked with `dpkg-deb -x`,
and their lazy-load databases (data/Rdata.rdx + data/Rdata.rdb) are read by the small R
serialization reader below:

  * Rdata.rdx is an R serialization (gzip-compressed, as saveRDS writes it) of a list with
    `variables` (object name -> c(offset, length) into the .rdb), `references` and `compressed`.
  * Each object in Rdata.rdb is a 4-byte big-endian uncompressed length followed by the
    compressed R serialization (zlib for compressed=TRUE/1; bzip2 (2) and xz (3) carry one
    extra type byte after the length).
  * The serialization is R's XDR format: "X\\n", version 2 or 3 header, then a tree of SEXPs.

Output (written atomically; existing files are replaced):
  <out>/austen/<novel>.txt   prideprejudice, sensesensibility, mansfieldpark, emma,
                             northangerabbey, persuasion: the novel's lines joined with "\\n"
  <out>/austen_all.txt       the six novels concatenated in that order
  <out>/mobydick.txt         Moby Dick (byte-order mark dropped, CRLF line ends made "\n")

Usage: scripts/extract_texts.py [--out data] [--deb-dir DIR]
  --deb-dir DIR  use the two .deb files already in DIR instead of running apt-get download.
"""
import argparse
import bz2
import glob
import gzip
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

AUSTEN_NOVELS = ["prideprejudice", "sensesensibility", "mansfieldpark", "emma",
                 "northangerabbey", "persuasion"]
PACKAGES = ["r-cran-janeaustenr", "r-cran-tokenizers"]


class RFormatError(Exception):
    pass


# SEXP type codes (R's Rinternals.h / serialize.c)
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
SPECIALSXP, BUILTINSXP, CHARSXP, LGLSXP, INTSXP, REALSXP = 7, 8, 9, 10, 13, 14
CPLXSXP, STRSXP, DOTSXP, VECSXP, EXPRSXP, BCODESXP = 15, 16, 17, 19, 20, 21
EXTPTRSXP, WEAKREFSXP, RAWSXP, S4SXP = 22, 23, 24, 25
ALTREP_SXP, ATTRLISTSXP, ATTRLANGSXP = 238, 239, 240
BASEENV_SXP, EMPTYENV_SXP, BCREPREF, BCREPDEF = 241, 242, 243, 244
GENERICREFSXP, CLASSREFSXP, PERSISTSXP, PACKAGESXP, NAMESPACESXP = 245, 246, 247, 248, 249
BASENAMESPACE_SXP, MISSINGARG_SXP, UNBOUNDVALUE_SXP, GLOBALENV_SXP, NILVALUE_SXP = \
    250, 251, 252, 253, 254
REFSXP = 255

NA_INTEGER = -2147483648
# CHARSXP encoding bits, stored in the "levels" part of the flags word
LATIN1_MASK, UTF8_MASK, BYTES_MASK, ASCII_MASK = 1 << 2, 1 << 3, 1 << 1, 1 << 6


class RObj:
    """A decoded SEXP: `kind` is the type code, `value` the payload, `attrs` a dict or None."""
    __slots__ = ("kind", "value", "attrs")

    def __init__(self, kind, value, attrs=None):
        self.kind, self.value, self.attrs = kind, value, attrs

    def attr(self, name):
        return (self.attrs or {}).get(name)


class RSym:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class XdrReader:
    """Reads one R XDR serialization stream (format 'X', versions 2 and 3)."""

    def __init__(self, data):
        self.d = data
        self.p = 0
        self.refs = []
        self.native_encoding = "utf-8"

    def need(self, n):
        if self.p + n > len(self.d):
            raise RFormatError("serialization truncated at byte %d (need %d more)" % (self.p, n))

    def int(self):
        self.need(4)
        (v,) = struct.unpack_from(">i", self.d, self.p)
        self.p += 4
        return v

    def bytes(self, n):
        self.need(n)
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def length(self):
        n = self.int()
        if n == -1:  # long vector: two more ints
            hi, lo = self.int(), self.int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        if n < 0:
            raise RFormatError("negative vector length %d at byte %d" % (n, self.p))
        return n

    def read(self):
        if self.bytes(2) != b"X\n":
            raise RFormatError("not an R XDR serialization (format byte %r)" % self.d[:2])
        version = self.int()
        self.int()  # R version that wrote it
        self.int()  # minimal R version to read it
        if version == 3:
            n = self.int()
            enc = self.bytes(n).decode("ascii", "replace")
            self.native_encoding = {"UTF-8": "utf-8", "latin1": "latin-1",
                                    "ISO-8859-1": "latin-1"}.get(enc, "utf-8")
        elif version != 2:
            raise RFormatError("unsupported serialization version %d (2 and 3 are known)" % version)
        return self.item()

    def persistent_names(self):
        if self.int() != 0:
            raise RFormatError("persistent name vector: expected 0 at byte %d" % (self.p - 4))
        return [self.item() for _ in range(self.length())]

    def charsxp(self, levels):
        n = self.int()
        if n == -1:
            return None  # NA_character_
        raw = self.bytes(n)
        if levels & UTF8_MASK or levels & ASCII_MASK:
            return raw.decode("utf-8", "replace")
        if levels & LATIN1_MASK:
            return raw.decode("latin-1")
        if levels & BYTES_MASK:
            return raw.decode("latin-1")
        try:
            return raw.decode(self.native_encoding)
        except UnicodeDecodeError:
            return raw.decode("latin-1")

    def attributes(self):
        """Reads a pairlist of attributes into a dict name -> value."""
        lst = self.item()
        out = {}
        if isinstance(lst, RObj) and lst.kind == LISTSXP:
            for tag, val in lst.value:
                out[tag.name if isinstance(tag, RSym) else str(tag)] = val
        return out

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        levels = flags >> 12
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))

        if t == NILVALUE_SXP:
            return None
        if t in (EMPTYENV_SXP, BASEENV_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP,
                 BASENAMESPACE_SXP):
            return RObj(t, None)
        if t == REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            if not 1 <= idx <= len(self.refs):
                raise RFormatError("reference %d out of range (%d known)" % (idx, len(self.refs)))
            return self.refs[idx - 1]
        if t == PERSISTSXP:
            o = RObj(t, self.persistent_names())
            self.refs.append(o)
            return o
        if t in (NAMESPACESXP, PACKAGESXP):
            o = RObj(t, self.persistent_names())
            self.refs.append(o)
            return o
        if t == SYMSXP:
            name = self.item()  # a CHARSXP, decoded to str
            s = RSym(name if isinstance(name, str) else "")
            self.refs.append(s)
            return s
        if t == ENVSXP:
            o = RObj(t, {})
            self.refs.append(o)
            self.int()  # locked
            enclos, frame, hashtab, attrib = self.item(), self.item(), self.item(), self.item()
            o.value = {"enclos": enclos, "frame": frame, "hashtab": hashtab}
            if isinstance(attrib, RObj) and attrib.kind == LISTSXP:
                o.attrs = {k.name if isinstance(k, RSym) else str(k): v for k, v in attrib.value}
            return o
        if t in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
            # pairlists are read iteratively along the CDR chain to keep recursion shallow
            cells = []
            attrs = None
            kind = LANGSXP if t == ATTRLANGSXP else LISTSXP if t == ATTRLISTSXP else t
            first_attrs = None
            while True:
                a = self.attributes() if has_attr else None
                if first_attrs is None:
                    first_attrs = a
                tag = self.item() if has_tag else None
                car = self.item()
                cells.append((tag, car))
                # peek the CDR: continue in the loop when it is another pairlist cell
                nflags = self.int()
                nt = nflags & 0xFF
                if nt in (LISTSXP, ATTRLISTSXP) and t in (LISTSXP, ATTRLISTSXP):
                    t = nt
                    has_attr = bool(nflags & (1 << 9))
                    has_tag = bool(nflags & (1 << 10))
                    continue
                self.p -= 4
                cdr = self.item()
                if cdr is not None:
                    cells.append(("<cdr>", cdr))
                break
            attrs = first_attrs
            return RObj(kind, cells, attrs)
        if t in (SPECIALSXP, BUILTINSXP):
            n = self.int()
            return RObj(t, self.bytes(n).decode("ascii", "replace"))
        if t == CHARSXP:
            return self.charsxp(levels)
        if t in (LGLSXP, INTSXP):
            n = self.length()
            vals = list(struct.unpack_from(">%di" % n, self.bytes(4 * n)))
            o = RObj(t, vals)
        elif t == REALSXP:
            n = self.length()
            o = RObj(t, list(struct.unpack_from(">%dd" % n, self.bytes(8 * n))))
        elif t == CPLXSXP:
            n = self.length()
            v = struct.unpack_from(">%dd" % (2 * n), self.bytes(16 * n))
            o = RObj(t, [complex(v[2 * i], v[2 * i + 1]) for i in range(n)])
        elif t == STRSXP:
            n = self.length()
            vals = []
            for _ in range(n):
                f = self.int()
                if f & 0xFF != CHARSXP:
                    raise RFormatError("STRSXP element of type %d at byte %d" % (f & 0xFF, self.p))
                vals.append(self.charsxp(f >> 12))
            o = RObj(t, vals)
        elif t in (VECSXP, EXPRSXP):
            n = self.length()
            o = RObj(t, [self.item() for _ in range(n)])
        elif t == RAWSXP:
            n = self.length()
            o = RObj(t, self.bytes(n))
        elif t == S4SXP:
            o = RObj(t, None)
        elif t == EXTPTRSXP:
            o = RObj(t, None)
            self.refs.append(o)
            o.value = (self.item(), self.item())  # prot, tag
        elif t == WEAKREFSXP:
            o = RObj(t, None)
            self.refs.append(o)
        elif t == ALTREP_SXP:
            info = self.item()
            state = self.item()
            attr = self.item()
            o = self.altrep(info, state)
            if isinstance(attr, RObj) and attr.kind == LISTSXP:
                o.attrs = {k.name if isinstance(k, RSym) else str(k): v for k, v in attr.value}
            return o
        else:
            raise RFormatError("unsupported SEXP type %d at byte %d (byte code and other "
                               "exotic types are not needed for data objects)" % (t, self.p - 4))
        if has_attr:
            o.attrs = self.attributes()
        return o

    def altrep(self, info, state):
        """Expands the ALTREP classes that can appear in saved data to ordinary vectors."""
        cls = ""
        if isinstance(info, RObj) and info.kind == LISTSXP and info.value:
            first = info.value[0][1]
            cls = first.name if isinstance(first, RSym) else ""
        if cls in ("compact_intseq", "compact_realseq") and isinstance(state, RObj):
            n, start, inc = state.value[:3]
            n, start, inc = int(n), state.value[1], state.value[2]
            vals = [start + i * inc for i in range(n)]
            if cls == "compact_intseq":
                return RObj(INTSXP, [int(v) for v in vals])
            return RObj(REALSXP, vals)
        if cls in ("wrap_integer", "wrap_real", "wrap_string", "wrap_logical", "wrap_list",
                   "wrap_complex", "wrap_raw") and isinstance(state, RObj):
            return state.value[0][1] if state.kind == LISTSXP else state.value[0]
        if cls == "deferred_string" and isinstance(state, RObj) and state.kind == LISTSXP:
            arg = state.value[0][1]
            return RObj(STRSXP, [None if v == NA_INTEGER else str(v) for v in arg.value])
        raise RFormatError("unsupported ALTREP class '%s'" % cls)


def unserialize(data):
    return XdrReader(data).read()


def read_rds(path):
    """readRDS(): gzip/bzip2/xz-compressed or plain serialization."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:3] == b"BZh":
        raw = bz2.decompress(raw)
    elif raw[:6] == b"\xfd7zXZ\x00":
        raw = lzma.decompress(raw)
    return unserialize(raw)


def named_list(obj):
    """A VECSXP with a names attribute -> dict."""
    if not isinstance(obj, RObj) or obj.kind != VECSXP:
        raise RFormatError("expected a named list")
    names = obj.attr("names")
    if names is None:
        raise RFormatError("list has no names attribute")
    return dict(zip(names.value, obj.value))


def lazyload_db(rdx_path):
    """Returns {object name: decoded object} for every variable of an R lazy-load database."""
    index = named_list(read_rds(rdx_path))
    rdb_path = rdx_path[:-4] + ".rdb"
    with open(rdb_path, "rb") as f:
        rdb = f.read()
    comp = index.get("compressed")
    ctype = 1
    if isinstance(comp, RObj) and comp.value:
        c = comp.value[0]
        ctype = 1 if c is True else int(c)
    variables = named_list(index["variables"])
    out = {}
    for name, pos in variables.items():
        off, length = int(pos.value[0]), int(pos.value[1])
        if off < 0 or length < 4 or off + length > len(rdb):
            raise RFormatError("%s: object %s at %d+%d lies outside the file (%d bytes)"
                               % (rdb_path, name, off, length, len(rdb)))
        blob = rdb[off:off + length]
        (ulen,) = struct.unpack(">I", blob[:4])
        if ctype == 0:
            data = blob[4:]
        elif ctype == 1:
            data = zlib.decompress(blob[4:])
        else:
            kind, body = blob[4:5], blob[5:]
            if kind == b"2":
                data = bz2.decompress(body)
            elif kind == b"Z":
                data = lzma.decompress(body)
            elif kind == b"1":
                data = zlib.decompress(body)
            elif kind == b"0":
                data = body
            else:
                raise RFormatError("%s: object %s has unknown compression byte %r"
                                   % (rdb_path, name, kind))
        if len(data) != ulen:
            raise RFormatError("%s: object %s decompressed to %d bytes, header says %d"
                               % (rdb_path, name, len(data), ulen))
        out[name] = unserialize(data)
    return out


def char_vector(obj, what):
    if not isinstance(obj, RObj) or obj.kind != STRSXP:
        raise RFormatError("%s is not a character vector" % what)
    return ["" if s is None else s for s in obj.value]


def write_atomic(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def fetch_debs(dest):
    # apt's _apt user must be able to write the download dir, else apt warns and runs unsandboxed
    os.chmod(dest, 0o777)
    r = subprocess.run(["apt-get", "download"] + PACKAGES, cwd=dest,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("extract_texts: `apt-get download %s` failed:\n%s\n(run `apt-get update` "
                 "first if the package lists are empty)" % (" ".join(PACKAGES), r.stdout))


def find_deb(deb_dir, pkg):
    hits = sorted(glob.glob(os.path.join(deb_dir, pkg + "_*.deb")))
    if not hits:
        sys.exit("extract_texts: no %s_*.deb in %s" % (pkg, deb_dir))
    return hits[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="data", help="output directory (default: data)")
    ap.add_argument("--deb-dir", help="directory already holding the two .deb files")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="comet-texts-")
    try:
        deb_dir = args.deb_dir
        if not deb_dir:
            deb_dir = os.path.join(tmp, "debs")
            os.makedirs(deb_dir)
            fetch_debs(deb_dir)
        root = os.path.join(tmp, "root")
        for pkg in PACKAGES:
            subprocess.run(["dpkg-deb", "-x", find_deb(deb_dir, pkg), root], check=True)
        lib = os.path.join(root, "usr", "lib", "R", "site-library")

        austen = lazyload_db(os.path.join(lib, "janeaustenr", "data", "Rdata.rdx"))
        texts = []
        for novel in AUSTEN_NOVELS:
            if novel not in austen:
                sys.exit("extract_texts: janeaustenr data has no object '%s' (has: %s)"
                         % (novel, ", ".join(sorted(austen))))
            text = "\n".join(char_vector(austen[novel], novel)) + "\n"
            write_atomic(os.path.join(args.out, "austen", novel + ".txt"), text)
            texts.append(text)
            print("extract_texts: %s/austen/%s.txt  %d lines, %d bytes"
                  % (args.out, novel, text.count("\n"), len(text.encode("utf-8"))))
        write_atomic(os.path.join(args.out, "austen_all.txt"), "".join(texts))

        tok = lazyload_db(os.path.join(lib, "tokenizers", "data", "Rdata.rdx"))
        if "mobydick" not in tok:
            sys.exit("extract_texts: tokenizers data has no object 'mobydick' (has: %s)"
                     % ", ".join(sorted(tok)))
        # one string in the package, as Project Gutenberg ships it: drop the byte-order mark
        # and use "\n" line ends like the Austen texts
        text = "\n".join(char_vector(tok["mobydick"], "mobydick"))
        text = text.lstrip("\ufeff").replace("\r\n", "\n")
        if not text.endswith("\n"):
            text += "\n"
        write_atomic(os.path.join(args.out, "mobydick.txt"), text)
        print("extract_texts: %s/mobydick.txt  %d bytes" % (args.out, len(text.encode("utf-8"))))
    except RFormatError as e:
        sys.exit("extract_texts: %s" % e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
