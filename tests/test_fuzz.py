"""Coverage-guided fuzzing of the CPU decoder under ASan and UBSan: the short CI campaign.

fuzz_harness.cc (the libFuzzer target) is linked with fuzz_driver.cc, our
coverage-guided driver on g++'s -fsanitize-coverage=trace-pc, and run from the
seed corpus of fuzz_seeds.py. The long campaign with clang's libFuzzer and its
figures are in docs/RELIABILITY.md.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_seeds import write_seeds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ["-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
CAMPAIGN_S = 16
PORTABLE_RUNS = 3000
SIMD_RUNS = 4000


def build(tmp_path, target_sources, name):
    """Links target_sources, instrumented for coverage, with the driver (not instrumented)."""
    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to build the fuzzer"
    driver = tmp_path / "fuzz_driver.o"
    if not driver.exists():
        subprocess.run([compiler, *SANITIZE, "-c", str(ROOT / "tests" / "fuzz_driver.cc"), "-o", str(driver)],
                       check=True, timeout=300)
    exe = tmp_path / name
    subprocess.run([compiler, *SANITIZE, "-fsanitize-coverage=trace-pc", f"-I{ROOT / 'ffi'}", *map(str, target_sources),
                    str(driver), "-o", str(exe)], check=True, timeout=300)
    return exe


def campaign(exe, corpus, *args, env=None, timeout=CAMPAIGN_S + 120):
    env = {**{k: v for k, v in os.environ.items() if k not in ("ZIPCCL_NO_SIMD", "ZIPCCL_SIMD")}, **(env or {})}
    return subprocess.run([str(exe), *args, str(corpus)], capture_output=True, text=True, timeout=timeout,
                          cwd=corpus.parent, env=env)


PATHS = {"simd": None, "avx2": {"ZIPCCL_SIMD": "avx2"}, "portable": {"ZIPCCL_NO_SIMD": "1"}}  # ffi/simd_cpu.h


@pytest.fixture(scope="module")
def fuzz_codec(tmp_path_factory):
    """The codec's fuzz target, built once (each path is chosen at run time, by the environment)."""
    return build(tmp_path_factory.mktemp("fuzz"), [ROOT / "tests" / "fuzz_harness.cc", ROOT / "ffi" / "codec6_cpu.cc",
                                                   ROOT / "ffi" / "accumulate_cpu.cc"], "fuzz_codec")


@pytest.mark.parametrize("path", list(PATHS))
def test_coverage_guided_campaign_finds_nothing_and_grows_coverage(fuzz_codec, tmp_path, path):
    exe = fuzz_codec
    corpus = tmp_path / "corpus"
    seeds = write_seeds(corpus)
    # each run stops at a number of executions (its time limit only a guard), so a loaded machine makes
    # it slower, not shorter (CI once ran 1,853 in a SIMD run's 16 s); the SIMD paths (the widest the CPU
    # has, and AVX2) get more of them
    runs = PORTABLE_RUNS if path == "portable" else SIMD_RUNS
    limit = [f"-runs={runs}", f"-max_total_time={4 * CAMPAIGN_S}"]
    run = campaign(exe, corpus, *limit, "-seed=7", "-artifact_prefix=" + str(tmp_path) + "/", env=PATHS[path])
    assert run.returncode == 0 and "0 crashes" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
    assert not list(tmp_path.glob("crash-*"))
    stats = re.search(r"(\d+) executions .* corpus (\d+) inputs .* (\d+) new; edges (\d+) \(seeds reached (\d+)\)",
                      run.stdout)
    execs, corpus_size, new, edges, seed_edges = map(int, stats.groups())
    print(run.stdout)
    assert execs > 2000 and corpus_size > seeds // 2 and new > 0
    assert edges > seed_edges  # mutations reach code the valid seeds do not


PLANTED = r"""
#include <cstdint>
#include <cstdlib>
#include <cstring>
// A heap overflow behind a 6-byte check, byte by byte: blind random inputs
// would need ~2^48 tries; coverage guidance finds one byte at a time.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* d, size_t n) {
  if (n >= 6 && d[0] == 'Z' && d[1] == 'C')
    if (d[2] == 'C' && d[3] == 'L')
      if (d[4] == 0x42)
        if (d[5] == 0x17) {
          char* p = static_cast<char*>(std::malloc(4));
          p[n] = 1;  // out of bounds
          std::free(p);
        }
  return 0;
}
"""


def test_driver_is_coverage_guided_and_reports_asan_crashes(tmp_path):
    """The driver reaches a bug hidden behind six exact bytes from a one-byte seed and
    writes the crashing input, so a clean campaign above means something."""
    source = tmp_path / "planted.cc"
    source.write_text(PLANTED)
    exe = build(tmp_path, [source], "planted")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "seed").write_bytes(b"A")
    run = campaign(exe, corpus, "-runs=3000000", "-seed=3", "-artifact_prefix=" + str(tmp_path) + "/", timeout=300)
    report = run.stderr  # UBSan's object-size check or ASan, whichever fires first
    assert run.returncode != 0 and re.search("heap-buffer-overflow|insufficient space", report), report[-2000:]
    assert "fuzz_driver: crash after" in report
    crashes = list(tmp_path.glob("crash-*"))
    assert len(crashes) == 1 and crashes[0].read_bytes()[:6] == b"ZCCL\x42\x17"
