// A small coverage-guided fuzzing driver for a libFuzzer target
// (LLVMFuzzerTestOneInput), for machines with g++ but no clang: the target is
// compiled with -fsanitize-coverage=trace-pc, which calls
// __sanitizer_cov_trace_pc() on every basic block; this file (compiled
// without it) hashes consecutive blocks into edges, AFL-style, keeps every
// input that reaches a new edge or a new hit-count bucket of one, and mutates
// the corpus. The flags mimic libFuzzer's:
//   fuzz_driver [-runs=N] [-max_total_time=S] [-seed=K] [-max_len=L]
//               [-artifact_prefix=P] CORPUS_DIR
// Seeds are read from CORPUS_DIR and new inputs are written to it. A crash
// (sanitizer report or abort) writes the input to P + "crash-<exec>".
#include <dirent.h>
#include <sanitizer/common_interface_defs.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr size_t kMapSize = 1 << 16;
uint8_t g_hits[kMapSize];
uintptr_t g_prev;

using Bytes = std::vector<uint8_t>;
const Bytes* g_current;
uint64_t g_execs;
std::string g_artifacts;

void save(const std::string& path, const Bytes& b) {
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(b.data(), 1, b.size(), f);
    std::fclose(f);
  }
}

void on_crash() {
  if (!g_current) return;
  const std::string path = g_artifacts + "crash-" + std::to_string(g_execs);
  save(path, *g_current);
  std::fprintf(stderr, "fuzz_driver: crash after %llu executions; input written to %s\n",
               static_cast<unsigned long long>(g_execs), path.c_str());
  g_current = nullptr;
}

void on_signal(int sig) {
  on_crash();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Hit counts fall into 8 buckets (1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+).
uint8_t bucket(uint8_t c) {
  if (c <= 3) return uint8_t(1u << (c - 1));
  if (c < 8) return 8;
  if (c < 16) return 16;
  if (c < 32) return 32;
  return c < 128 ? 64 : 128;
}

struct Fuzzer {
  std::mt19937_64 rng;
  size_t max_len;
  std::vector<Bytes> corpus;
  uint8_t seen[kMapSize] = {};  // buckets ever reached, per edge
  size_t edges = 0;

  // Runs one input; returns whether it reached anything new.
  bool run(const Bytes& input) {
    std::memset(g_hits, 0, sizeof g_hits);
    g_prev = 0;
    g_current = &input;
    Bytes exact(input);  // the target sees a buffer of exactly input.size() bytes
    LLVMFuzzerTestOneInput(exact.empty() ? nullptr : exact.data(), exact.size());
    g_current = nullptr;
    ++g_execs;
    bool fresh = false;
    for (size_t i = 0; i < kMapSize; ++i) {
      if (!g_hits[i]) continue;
      const uint8_t b = bucket(g_hits[i]);
      if (seen[i] & b) continue;
      edges += !seen[i];
      seen[i] |= b;
      fresh = true;
    }
    return fresh;
  }

  size_t pick(size_t n) { return n ? size_t(rng() % n) : 0; }

  // Offsets in the header, descriptors and tables are where structure lives.
  size_t offset(const Bytes& b) { return pick(rng() % 2 ? std::min<size_t>(b.size(), 320) : b.size()); }

  void mutate(Bytes& b) {
    static const uint32_t interesting[] = {0, 1, 2, 3, 4, 6, 7, 8, 12, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256,
                                           4095, 4096, 8192, 16384, 32767, 32768, 65535, 65536, 0x7FFFFFFF, 0xFFFFFFFF};
    const int rounds = 1 << pick(4);
    for (int r = 0; r < rounds; ++r) {
      const size_t at = offset(b);
      switch (pick(b.empty() ? 2 : 10)) {
        case 0:  // insert random bytes
          b.insert(b.begin() + std::ptrdiff_t(std::min(at, b.size())), 1 + pick(8), uint8_t(rng()));
          break;
        case 1:  // splice with another corpus entry
          if (const Bytes& o = corpus[pick(corpus.size())]; !o.empty()) {
            const size_t from = pick(o.size()), len = 1 + pick(o.size() - from);
            b.resize(std::min(b.size(), at));
            b.insert(b.end(), o.begin() + std::ptrdiff_t(from), o.begin() + std::ptrdiff_t(from + len));
          }
          break;
        case 2: b[at] ^= uint8_t(1u << pick(8)); break;
        case 3: b[at] = uint8_t(rng()); break;
        case 4: b[at] = uint8_t(interesting[pick(sizeof interesting / sizeof *interesting)]); break;
        case 5: b[at] = uint8_t(b[at] + int(pick(33)) - 16); break;
        case 6: {  // a little-endian u16 or u32 set to an interesting value
          const uint32_t v = interesting[pick(sizeof interesting / sizeof *interesting)];
          const size_t width = rng() % 2 ? 2 : 4;
          for (size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = uint8_t(v >> (8 * i));
          break;
        }
        case 7: b.resize(at); break;  // truncate
        case 8: b.erase(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(std::min(b.size(), at + 1 + pick(16)))); break;
        default: {  // copy a range over another place
          const size_t from = pick(b.size()), len = std::min(b.size() - std::max(from, at), 1 + pick(64));
          std::memmove(b.data() + at, b.data() + from, len);
        }
      }
    }
    if (b.size() > max_len) b.resize(max_len);
  }
};

bool flag(const char* arg, const char* name, long long* value) {
  const size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) || arg[len] != '=') return false;
  *value = std::atoll(arg + len + 1);
  return true;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') names.push_back(dir + "/" + e->d_name);
    closedir(d);
  }
  return names;
}

Bytes load(const std::string& path) {
  Bytes b;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    uint8_t buf[65536];
    for (size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) b.insert(b.end(), buf, buf + got);
    std::fclose(f);
  }
  return b;
}

}  // namespace

// g++ links UBSan's runtime apart from ASan's, so ASan's death callback does
// not see UBSan reports: make them abort, which on_signal catches.
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1:abort_on_error=1"; }

extern "C" void __sanitizer_cov_trace_pc() {
  const uintptr_t pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  const uintptr_t cur = (pc ^ (pc >> 16)) * 0x9E3779B1u;
  ++g_hits[(cur ^ g_prev) & (kMapSize - 1)];
  g_prev = cur >> 1;
}

int main(int argc, char** argv) {
  long long runs = -1, max_time = 0, seed = 1, max_len = 1 << 17;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    if (flag(argv[i], "-runs", &runs) || flag(argv[i], "-max_total_time", &max_time) || flag(argv[i], "-seed", &seed) ||
        flag(argv[i], "-max_len", &max_len))
      continue;
    if (!std::strncmp(argv[i], "-artifact_prefix=", 17)) g_artifacts = argv[i] + 17;
    else if (argv[i][0] == '-') std::fprintf(stderr, "ignoring %s\n", argv[i]);
    else dir = argv[i];
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: %s [-runs=N] [-max_total_time=S] [-seed=K] [-max_len=L] CORPUS_DIR\n", argv[0]);
    return 2;
  }
  __sanitizer_set_death_callback(on_crash);
  std::signal(SIGABRT, on_signal);
  std::signal(SIGSEGV, on_signal);

  Fuzzer f;
  f.rng.seed(uint64_t(seed));
  f.max_len = size_t(max_len);
  const auto names = list_dir(dir);
  for (const std::string& name : names) {
    Bytes b = load(name);
    if (f.run(b) || f.corpus.empty()) f.corpus.push_back(std::move(b));
  }
  const size_t seeds = names.size(), seed_edges = f.edges;
  std::printf("seeds: %zu files, %zu kept, %zu edges\n", seeds, f.corpus.size(), f.edges);
  const auto start = std::chrono::steady_clock::now();
  size_t found = 0;
  for (long long i = 0; runs < 0 || i < runs; ++i) {
    if (max_time && (i & 63) == 0 &&
        std::chrono::steady_clock::now() - start > std::chrono::seconds(max_time))
      break;
    Bytes b = f.corpus[f.pick(f.corpus.size())];
    f.mutate(b);
    if (f.run(b)) {
      save(dir + "/new-" + std::to_string(seed) + "-" + std::to_string(found++), b);
      f.corpus.push_back(std::move(b));
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t bytes = 0;
  for (const Bytes& b : f.corpus) bytes += b.size();
  std::printf("done: %llu executions in %.1f s (%.0f/s); corpus %zu inputs (%zu bytes), %zu new; "
              "edges %zu (seeds reached %zu); 0 crashes\n",
              static_cast<unsigned long long>(g_execs), secs, double(g_execs - seeds) / (secs > 0 ? secs : 1),
              f.corpus.size(), bytes, found, f.edges, seed_edges);
  return 0;
}
