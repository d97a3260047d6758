"""The C GEMM of `xfuse aot --emit-c`: one generated function per dot_general, following
`runtime.products.dot_plan` (batch, free and contracting index groups read through strides or
offset tables), its result cut into register tiles split across OpenMP threads.
"""

from __future__ import annotations

import numpy as np

from xfuse.backends.c import render
from xfuse.runtime.products import dot_plan

ITEMSIZE = {"bool": 1, "bool_": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4,
            "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8}
DOT_TILE_ROWS = 8  # a GEMM tile of the result: 8 rows of 64 bytes, its sums in registers
DOT_PARALLEL_WORK = 1 << 16  # multiply-adds from which a GEMM splits across OpenMP threads

def _join(items) -> str:
    return ", ".join(map(str, items))


def _ctype(dtype: str) -> str:
    return render.CTYPES[dtype]


# ---------------------------------------------------------------------------- GEMM
def _parallel(split: bool, loops: int) -> list[str]:
    """The pragma splitting the next `loops` nested loops across OpenMP threads, when `split`."""
    if not split:
        return []
    return ["#ifdef _OPENMP", f"#pragma omp parallel for collapse({loops}) schedule(static)", "#endif"]


def _strides(dims) -> list[int]:
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return strides[::-1]


def _group(dims, axes) -> tuple[int, int | None, list[int], list[int]]:
    """(size, element stride or None, dims, strides) of the index group over `axes` (row-major
    in that order); the stride is None when the offsets are no arithmetic progression."""
    strides = _strides(dims)
    gdims, gstrides = [dims[a] for a in axes], [strides[a] for a in axes]
    live = [(d, s) for d, s in zip(gdims, gstrides) if d != 1]
    size = int(np.prod(gdims, dtype=np.int64)) if gdims else 1
    affine = all(s == live[n + 1][1] * live[n + 1][0] for n, (_, s) in enumerate(live[:-1]))
    return size, ((live[-1][1] if live else 0) if affine else None), gdims, gstrides


def gemm(fn: str, d: dict, operand_dtypes: list[str], openmp: bool, step: str) -> str:
    """C for `int fn(const TA *a, const TB *b, TC *c)`: c (C order, the dot_general's result) =
    dot_general(a, b), each element accumulated in c's type over k in order (floats with the
    CPU's fused multiply-add where it has one, as BLAS does); 1 when out of memory.

    Operands are read through the strides of their transposes (an index group that collapses
    no stride, offset tables); a b whose n is not contiguous is first copied as (B, K, N). The
    result is cut into tiles of DOT_TILE_ROWS x one vector's bytes: a whole tile keeps its sums
    in registers over all k (the compiler vectorises its columns), a tile at an edge sums
    element by element. Tiles are split across OpenMP threads."""
    lhs, rhs, (lc, rc), (lb, rb) = d["lhs"], d["rhs"], d["contracting"], d["batch"]
    (lperm, (B, M, K)), (rperm, (_, _, N)), _ = dot_plan(lhs, rhs, (lc, rc), (lb, rb))
    nb, nf = len(lb), len(lhs) - len(lc) - len(lb)
    groups = {"ab": _group(lhs, lperm[:nb]), "am": _group(lhs, lperm[nb:nb + nf]),
              "ak": _group(lhs, lperm[nb + nf:]), "bb": _group(rhs, rperm[:nb]),
              "bk": _group(rhs, rperm[nb:nb + len(rc)]), "bn": _group(rhs, rperm[nb + len(rc):])}
    ta, tb, tc = (_ctype(t) for t in (*operand_dtypes, d["dtype"]))
    lines = [f"/* {step}: dot_general of {d['lhs']} x {d['rhs']}, contracting={lc};{rc}, batch={lb};{rb}",
             f"   as (B={B}, M={M}, K={K}) x (B={B}, K={K}, N={N}) -> {d['dtype']}{d['dims']} */",
             f"static int {fn}(const {ta} *restrict a, const {tb} *restrict b, {tc} *restrict c) {{"]
    tables, index = [], {}
    for key, var in (("ab", "ib"), ("am", "m"), ("ak", "k"), ("bb", "ib"), ("bk", "k"), ("bn", "n")):
        size, stride, gdims, gstrides = groups[key]
        if stride is None:
            table = f"xf_{key}"  # the offsets of the group's indices
            tables.append((table, len(gdims)))
            lines += [f"    static const int64_t {table}_dims[{len(gdims)}] = {{{_join(gdims)}}};",
                      f"    static const int64_t {table}_strides[{len(gdims)}] = {{{_join(gstrides)}}};",
                      f"    int64_t *{table} = malloc({max(1, size)} * sizeof(int64_t));"]
            index[key] = f"{table}[{var}]"
        else:
            index[key] = "0" if stride == 0 or size == 1 else var if stride == 1 else f"{var} * {stride}"
    buffers = [t for t, _ in tables]
    pack = groups["bn"][1] != 1 and N > 1  # b's n is not contiguous: copy b as (B, K, N) first
    if pack:
        buffers.append("xf_packed")
        lines.append(f"    {tb} *xf_packed = malloc({max(1, B * K * N)} * sizeof({tb}));")
    if buffers:
        lines.append(f"    if ({' || '.join(f'!{t}' for t in buffers)}) {{")
        lines += [f"        free({t});" for t in buffers] + ["        return 1;", "    }"]
        lines += [f"    xf_offsets({t}, {rank}, {t}_dims, {t}_strides);" for t, rank in tables]
    if pack:
        lines += _parallel(openmp and B * K * N >= DOT_PARALLEL_WORK and B * K > 1, 2)
        lines += [f"    for (int64_t ib = 0; ib < {B}; ib++) {{",
                  f"        for (int64_t k = 0; k < {K}; k++) {{",
                  f"            const {tb} *from = b + {index['bb']} + {index['bk']};",
                  f"            {tb} *to = xf_packed + (ib * {K} + k) * {N};",
                  f"            for (int64_t n = 0; n < {N}; n++) to[n] = from[{index['bn']}];",
                  "        }", "    }"]
        index.update(bb=f"ib * {K * N}" if B > 1 else "0", bk=f"k * {N}" if K > 1 else "0", bn="n")
    fma = {"float": "xf_fma_f32", "double": "xf_fma_f64"}.get(tc)
    muladd = (lambda x, y, z: f"{fma}({x}, {y}, {z})") if fma else (lambda x, y, z: f"{x} * {y} + {z}")
    source = "xf_packed" if pack else "b"
    a_at = f"a[{index['ab']} + {index['am']} + {index['ak']}]"
    b_at = f"{index['bb']} + {index['bk']}"
    tile_step = muladd("x", f"({tc})bk[{index['bn']}]", "sum[i][j]")
    edge_step = muladd(f"({tc}){a_at}", f"({tc}){source}[{b_at} + {index['bn']}]", "one")
    mr, nr = min(DOT_TILE_ROWS, max(M, 1)), min(max(1, 64 // ITEMSIZE[d["dtype"]]), max(N, 1))
    vector = tc in VECTOR and ta == tb == tc and index["bn"] == "n" and nr == VECTOR[tc][1] * 2
    if vector:  # AVX2 tiles where the target has them, else the portable loops below
        lines += ["#ifdef XF_GEMM_AVX2",
                  *_vector_tiles(tc, openmp, (B, M, N, K), a_at, f"{source} + {b_at}"),
                  "#else"]
    mt, nt = -(-M // mr), -(-N // nr)
    lines += _parallel(openmp and B * M * N * K >= DOT_PARALLEL_WORK and B * mt * nt > 1, 3)
    lines += [
        f"    for (int64_t ib = 0; ib < {B}; ib++) {{",
        f"        for (int64_t tn = 0; tn < {nt}; tn++) {{",
        f"            for (int64_t tm = 0; tm < {mt}; tm++) {{",
        f"                const int64_t m0 = tm * {mr}, n0 = tn * {nr};",
        f"                {tc} *cb = c + ib * {M * N};",
        f"                if (m0 + {mr} <= {M} && n0 + {nr} <= {N}) {{",
        f"                    {tc} sum[{mr}][{nr}] = {{{{0}}}};",
        f"                    for (int64_t k = 0; k < {K}; k++) {{",
        f"                        const {tb} *bk = {source} + {b_at};",
        f"                        for (int64_t i = 0; i < {mr}; i++) {{",
        "                            const int64_t m = m0 + i;",
        f"                            const {tc} x = ({tc}){a_at};",
        f"                            for (int64_t j = 0; j < {nr}; j++) {{",
        "                                const int64_t n = n0 + j;",
        f"                                sum[i][j] = {tile_step};",
        "                            }",
        "                        }",
        "                    }",
        f"                    for (int64_t i = 0; i < {mr}; i++)",
        f"                        for (int64_t j = 0; j < {nr}; j++) cb[(m0 + i) * {N} + n0 + j] = sum[i][j];",
        "                } else {  /* an edge tile */",
        f"                    for (int64_t m = m0; m < {M} && m < m0 + {mr}; m++) {{",
        f"                        for (int64_t n = n0; n < {N} && n < n0 + {nr}; n++) {{",
        f"                            {tc} one = 0;",
        f"                            for (int64_t k = 0; k < {K}; k++)",
        f"                                one = {edge_step};",
        f"                            cb[m * {N} + n] = one;",
        "                        }",
        "                    }",
        "                }",
        "            }",
        "        }",
        "    }"]
    if vector:
        lines.append("#endif")
    lines += [f"    free({t});" for t in buffers] + ["    return 0;", "}"]
    return "\n".join(lines)


# C type -> (AVX2 vector type, its lanes, its intrinsics' suffix)
VECTOR = {"float": ("__m256", 8, "ps"), "double": ("__m256d", 4, "pd")}
VECTOR_ROWS = 6  # an AVX2 tile: 6 rows of two vectors, its 12 sums in registers


def _vector_tiles(tc: str, openmp: bool, sizes: tuple, a_at: str, b_row: str) -> list[str]:
    """The GEMM's loops with AVX2 tiles of VECTOR_ROWS x two vectors: per k, two vectors of
    b's row and each row's element of a broadcast, one fused multiply-add per sum, in the
    order of k (the same sums as the portable loops). The rows left below the last whole
    tile make one smaller tile; columns left over (N not a multiple of the two vectors) are
    summed one element at a time."""
    vec, lanes, sfx = VECTOR[tc]
    B, M, N, K = sizes
    nr, mr = 2 * lanes, VECTOR_ROWS
    nt, mt = N // nr, -(-M // mr)
    load, fma = f"_mm256_loadu_{sfx}", f"_mm256_fmadd_{sfx}"

    def tile(rows: int, depth: int) -> list[str]:
        pad = "    " * depth
        sums = [f"s{i}{h}" for i in range(rows) for h in range(2)]
        out = [f"{pad}{vec} {', '.join(f'{x} = _mm256_setzero_{sfx}()' for x in sums)};",
               f"{pad}for (int64_t k = 0; k < {K}; k++) {{",
               f"{pad}    const {tc} *bk = {b_row} + n0;",
               f"{pad}    {vec} b0 = {load}(bk), b1 = {load}(bk + {lanes});",
               # held in registers: otherwise gcc folds the loads into every row's FMAs,
               # and a tile does more loads than multiply-adds
               f'{pad}    __asm__("" : "+x"(b0), "+x"(b1));']
        for i in range(rows):
            out += [f"{pad}    {{ const int64_t m = m0 + {i};",
                    f"{pad}      const {vec} x = _mm256_set1_{sfx}({a_at});",
                    f"{pad}      s{i}0 = {fma}(x, b0, s{i}0); s{i}1 = {fma}(x, b1, s{i}1); }}"]
        out.append(f"{pad}}}")
        for i in range(rows):
            out.append(f"{pad}_mm256_storeu_{sfx}(cb + (m0 + {i}) * {N} + n0, s{i}0); "
                       f"_mm256_storeu_{sfx}(cb + (m0 + {i}) * {N} + n0 + {lanes}, s{i}1);")
        return out

    fma1 = {"float": "xf_fma_f32", "double": "xf_fma_f64"}[tc]
    lines = _parallel(nt and openmp and B * M * N * K >= DOT_PARALLEL_WORK and B * mt * nt > 1, 3)
    lines += [f"    for (int64_t ib = 0; ib < {B}; ib++) {{",
              f"        for (int64_t tn = 0; tn < {nt}; tn++) {{",
              f"            for (int64_t tm = 0; tm < {mt}; tm++) {{",
              f"                const int64_t n0 = tn * {nr};",
              f"                {tc} *cb = c + ib * {M * N};",
              f"                if (tm * {mr} + {mr} <= {M}) {{",
              f"                    const int64_t m0 = tm * {mr};",
              *tile(mr, 5),
              *(["                } else {  /* the rows below the last whole tile */",
                 f"                    const int64_t m0 = tm * {mr};",
                 *tile(M % mr, 5)] if M % mr else []),
              "                }",
              "            }",
              "        }",
              "    }"]
    if N % nr:  # the columns right of the last whole tile, one element at a time
        lines += [f"    for (int64_t ib = 0; ib < {B}; ib++) {{",
                  f"        {tc} *cb = c + ib * {M * N};",
                  f"        for (int64_t m = 0; m < {M}; m++) {{",
                  f"            for (int64_t n = {nt * nr}; n < {N}; n++) {{",
                  f"                {tc} one = 0;",
                  f"                for (int64_t k = 0; k < {K}; k++) one = {fma1}({a_at}, ({b_row})[n], one);",
                  f"                cb[m * {N} + n] = one;",
                  "            }",
                  "        }",
                  "    }"]
    return lines


# ---------------------------------------------------------------------------- interface
