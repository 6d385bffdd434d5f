"""The malloc settings CPU workers start with (group.cpu_allocator), seen in a real process: its
large buffers come from the heap or from transparent huge pages, and the user's own glibc
tunables are kept."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from r1cloud.trainer.group import cpu_allocator

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# 256 MiB through malloc (above the 32 MiB mmap threshold: a fresh mapping), every 4 KiB page
# written, then this process's huge-page and fault counts.
TOUCH = """
import resource
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = bytearray(256 << 20)
b[::4096] = b"x" * (len(b) // 4096)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
rollup = open("/proc/self/smaps_rollup").read().split()
print(faults, int(rollup[rollup.index("AnonHugePages:") + 1]))
"""


def touch(env: dict[str, str]) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", TOUCH], env=env, capture_output=True, text=True, check=True)
    faults, huge_kib = map(int, out.stdout.split())
    return faults, huge_kib


# glibc asks for huge pages only where the kernel gives them on request ([madvise]); under [always]
# every process gets them anyway, and glibc before 2.35 has no such tunable
GLIBC = tuple(int(x) for x in (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0").split()[1].split(".")[:2])


@pytest.mark.skipif(
    not THP.is_file() or "[madvise]" not in THP.read_text() or GLIBC < (2, 35),
    reason="huge pages on request need the kernel's THP setting `madvise` and glibc 2.35 or later",
)
def test_workers_large_buffers_fault_in_huge_pages(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    plain_faults, plain_huge = touch({"PATH": "/usr/bin:/bin"})
    faults, huge = touch({"PATH": "/usr/bin:/bin", **cpu_allocator()})
    assert huge >= 128 << 10  # at least half of the 256 MiB in 2 MiB pages
    assert faults * 8 < plain_faults, (faults, plain_faults, plain_huge)  # 65,536 4-KiB faults without


def test_the_users_glibc_tunables_are_kept(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert cpu_allocator()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2")
    assert cpu_allocator()["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2"
