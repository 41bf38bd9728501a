"""What a shared object says about itself without running it: the libraries it needs (ELF
``DT_NEEDED``) and the GPU architectures its embedded CUDA code was compiled for (``.nv_fatbin``).

The ELF side uses pyelftools (a kept library). The fatbin container has no public library in
Python; its layout (read-only, headers only, payloads are skipped) is the one cuobjdump reads:

- container header, 16 bytes: ``u32 magic`` (0xBA55ED50), ``u16 version``, ``u16 header_size``
  (offset of the first entry), ``u64 size`` (bytes after the header);
- each entry: ``u16 kind`` (1 = PTX, 2 = ELF cubin), ``u16 ?``, ``u32 entry_header_size``,
  ``u64 payload_size`` (padded), ``u32 ?``, ``u32 ?``, ``u16 minor``, ``u16 major``,
  ``u32 arch`` (at byte 28, e.g. 90 for sm_90); the next entry starts at
  ``entry + entry_header_size + payload_size``.

Only headers are read (a few bytes per entry), so even a 1 GB ``libtorch_cuda.so`` takes
milliseconds.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, Field

FATBIN_MAGIC = 0xBA55ED50
_KIND = {1: "ptx", 2: "sm"}


class ArchList(BaseModel):
    """GPU code embedded in one binary: real cubins (``sm``) and PTX (``ptx``, JIT-able)."""

    sm: list[int] = Field(default_factory=list)  # e.g. [80, 86, 90]
    ptx: list[int] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.sm and not self.ptx

    def label(self) -> str:
        parts = [f"sm_{a}" for a in self.sm] + [f"compute_{a}" for a in self.ptx]
        return " ".join(parts) or "(no GPU code)"


def needed_libraries(path: str | Path) -> list[str]:
    """The ELF's ``DT_NEEDED`` entries (``libcudart.so.12``, ``libc10.so``, ...); [] if not ELF."""
    from elftools.common.exceptions import ELFError  # pyelftools: ~70 ms, only when read
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    tags = [t for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
                    return [str(t.needed) for t in tags]  # type: ignore[attr-defined]
    except (OSError, ELFError):
        return []
    return []


def init_function(path: str | Path) -> str | None:
    """The ``PyInit_<name>`` a Python extension module defines (None: a plain library).

    The name may differ from the file's: vLLM ships ``_C_AVX2.abi3.so`` that answers to ``_C``.
    """
    from elftools.common.exceptions import ELFError  # pyelftools: ~70 ms, only when read
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        with open(path, "rb") as fh:
            dynsym = ELFFile(fh).get_section_by_name(".dynsym")
            if not isinstance(dynsym, SymbolTableSection):
                return None
            for sym in dynsym.iter_symbols():
                if sym.name.startswith("PyInit_") and sym["st_shndx"] != "SHN_UNDEF":
                    return sym.name[len("PyInit_") :]
    except (OSError, ELFError):
        return None
    return None


def fatbin_archs(path: str | Path) -> ArchList | None:
    """The architectures in the binary's ``.nv_fatbin`` section; None when it has none."""
    from elftools.common.exceptions import ELFError  # pyelftools: ~70 ms, only when read
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            section = elf.get_section_by_name(".nv_fatbin")
            if section is None:
                return None
            start, size = section["sh_offset"], section["sh_size"]
            return read_fatbin(fh, start, size)
    except (OSError, ELFError, struct.error):
        return None


def read_fatbin(fh: BinaryIO, start: int, size: int) -> ArchList:
    """Walk every fatbin container in ``[start, start + size)`` of the open file ``fh``."""
    sm: set[int] = set()
    ptx: set[int] = set()
    pos, end = start, start + size
    while pos + 16 <= end:
        fh.seek(pos)
        head = fh.read(16)
        magic, _version, header_size, body = struct.unpack("<IHHQ", head)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned inside the section
            continue
        entry, container_end = pos + header_size, pos + header_size + body
        while entry + 32 <= container_end:
            fh.seek(entry)
            raw = fh.read(32)
            kind, _u, entry_size, payload = struct.unpack_from("<HHIQ", raw, 0)
            (arch,) = struct.unpack_from("<I", raw, 28)
            if entry_size == 0:
                break
            if kind in _KIND and 10 <= arch < 1000:
                (sm if _KIND[kind] == "sm" else ptx).add(arch)
            entry += entry_size + payload
        pos = max(container_end, pos + 16)
    return ArchList(sm=sorted(sm), ptx=sorted(ptx))


def runs_on(archs: ArchList, capability: int) -> tuple[bool, str]:
    """Whether code with ``archs`` runs on a GPU of compute capability ``capability`` (e.g. 120).

    CUDA's rules: a cubin runs on GPUs of the same major version and an equal or higher minor
    (sm_80 runs on 8.6, never on 9.0 or 12.0); PTX is compiled by the driver for any equal or
    newer GPU (slow first start, and only if the driver's JIT knows the GPU).
    """
    major = capability // 10
    same_major = [a for a in archs.sm if a // 10 == major and a <= capability]
    if same_major:
        return True, f"cubin sm_{max(same_major)}"
    older_ptx = [a for a in archs.ptx if a <= capability]
    if older_ptx:
        return True, f"PTX compute_{max(older_ptx)} (JIT-compiled by the driver at first use)"
    return False, f"no cubin for sm_{major}x at or below sm_{capability} and no PTX at or below it"
