"""Turns zpp's public C headers into a cffi declaration (ABI mode).

The structs, enums and prototypes the bindings use are read from the very
headers the library was built from, so the Python side cannot drift from
the C structs; the ``*_INIT`` macros (which carry the defaults) are read
too, and :func:`init_values` turns one into the nested list cffi takes to
initialise a struct.

Only what the headers use is handled: comments, line continuations,
``#ifdef __cplusplus`` / ``#if defined(_WIN32)`` blocks (skipped), integer
``#define``s (kept: cffi takes them as constants), ``{ ... }`` initialiser
macros (recorded), and every other preprocessor line (dropped).
"""

from __future__ import annotations

import re
from pathlib import Path

# Parsed in this order; zpp_mpi.h is handled apart (it includes mpi.h).
HEADERS = ("zpp.h", "zpp_comm.h", "zpp_coll.h", "zpp_runtime.h")

_INT_DEFINE = re.compile(r"#\s*define\s+(ZPP_\w+)\s+\(?\s*(-?\d+)\s*\)?\s*$")
_INIT_DEFINE = re.compile(r"#\s*define\s+(ZPP_\w+_INIT)\s+(\{.*\})\s*$")
_SKIPPED_IF = re.compile(r"#\s*if(def\s+__cplusplus|\s+defined\s*\(\s*_WIN32\s*\))")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def parse(text: str, inits: dict[str, str]) -> str:
    """cdef text of one header; its initialiser macros go into ``inits``."""
    text = _strip_comments(text).replace("\\\n", " ")
    out: list[str] = []
    depth = 0  # > 0: inside a skipped conditional block (nesting depth)
    for line in text.splitlines():
        s = line.strip()
        if depth:
            if re.match(r"#\s*if", s):
                depth += 1
            elif re.match(r"#\s*endif", s):
                depth -= 1
            continue
        if _SKIPPED_IF.match(s):
            depth = 1
            continue
        if s.startswith("#"):
            m = _INT_DEFINE.match(s)
            if m and not m.group(1).startswith("ZPP_ZPP_"):
                out.append("#define %s %s" % (m.group(1), m.group(2)))
            m = _INIT_DEFINE.match(s)
            if m:
                inits[m.group(1)] = m.group(2)
            continue
        out.append(line.replace("ZPP_API ", ""))
    return "\n".join(out)


def find_headers(candidates: list[Path]) -> Path:
    for d in candidates:
        if (d / "zpp" / "zpp.h").is_file():
            return d
    raise FileNotFoundError(
        "zpp headers (zpp/zpp.h) not found in: "
        + ", ".join(str(d) for d in candidates)
        + " (install the package from the zpp source tree, or set ZPP_INCLUDE_DIR)"
    )


def build_cdef(include_dir: Path) -> tuple[str, dict[str, str]]:
    inits: dict[str, str] = {}
    parts = [parse((include_dir / "zpp" / h).read_text(), inits) for h in HEADERS]
    # zpp_mpi.h: MPI_Comm is a pointer in Open MPI (the MPI zpp links here);
    # Comm.from_mpi checks that the MPI in the process is Open MPI.
    mpi = include_dir / "zpp" / "zpp_mpi.h"
    if mpi.is_file():
        parts.append("typedef void *MPI_Comm;")
        parts.append(parse(mpi.read_text(), inits))
    return "\n".join(parts), inits


def _split_top(body: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        items.append(cur.strip())
    return items


def init_values(name: str, inits: dict[str, str], ffi, lib):
    """The ``name`` initialiser macro as a nested list for ``ffi.new``."""

    def value(tok: str):
        tok = tok.strip()
        m = re.fullmatch(r"sizeof\s*\(\s*(\w+)\s*\)", tok)
        if m:
            return ffi.sizeof(m.group(1))
        if tok in inits:
            return init_values(tok, inits, ffi, lib)
        if tok.startswith("{"):
            return [value(t) for t in _split_top(tok[1:-1])]
        if tok == "NULL":
            return ffi.NULL
        # C literals with their suffixes: 32, 0x10, 4u, 2048ul; 0.0f, 1e-3, .5f
        m = re.fullmatch(r"(-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*", tok)
        if m:
            g = m.group(1)
            return int(g, 16) if "x" in g.lower() else int(g, 10)
        m = re.fullmatch(r"(-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[fFlL]?", tok)
        if m:
            return float(m.group(1))
        return getattr(lib, tok)  # an enum constant

    body = inits[name].strip()
    return [value(t) for t in _split_top(body[1:-1])]
