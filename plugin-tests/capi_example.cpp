// capi_example.cpp - the fabricoll native C API (include/fabricoll.h) from C++17, with RAII.
//
// Comm owns a fabricoll_comm (its destructor calls fabricoll_comm_destroy; move-only), Request
// owns a pending request (its destructor waits, so buffers never outlive a running collective).
// The parent forks N ranks (default 4) and waits for them with a deadline; rank 0 makes the unique
// id (its process hosts the bootstrap root) and hands it to the others through shared memory.
// Each rank runs every collective blocking and
// non-blocking with float / int32 / double data, checks the results, sends around the ring,
// splits into even and odd ranks, calls fabricoll_collective with per-call algorithms and
// exercises the error paths. Prints "capi_example: N passed, M failed" (checks summed over
// ranks); exits non-zero on failure.
//
// Usage: capi_example_cpp [-n NRANKS] [-t TIMEOUT_S] [-v]
#include "fabricoll.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#ifdef CAPI_ENUM_FALLBACK
// The Makefile defines CAPI_ENUM_FALLBACK when include/fabricoll.h lacks these enums (a header
// bug, reported as a failed check); the values are those of src/ffi/api.rs.
enum { FABRICOLL_INT32 = 2, FABRICOLL_FLOAT32 = 7, FABRICOLL_FLOAT64 = 8 };
enum { FABRICOLL_SUM = 0, FABRICOLL_MAX = 2, FABRICOLL_AVG = 4 };
enum { FABRICOLL_ALGO_AUTO = 0, FABRICOLL_ALGO_RING = 1, FABRICOLL_ALGO_RDH = 5 };
enum { FABRICOLL_COLL_ALLREDUCE = 0 };
#endif

namespace {

constexpr int kMaxRanks = 64;

struct Slot {
  int pass, fail, finished;
};

// The unique id goes from rank 0 to the others through this shared page. Rank 0 makes it (which
// starts the bootstrap root's thread in rank 0's process); the parent starts no thread before
// fork(), since a child forked while another thread holds a lock may wait on it forever.
struct IdBox {
  int ready;  // 0 not yet, 1 id valid, -1 rank 0 failed to make it
  fabricoll_unique_id id;
};
Slot *g_slot = nullptr;
int g_rank = -1, g_n = 0;
bool g_verbose = false;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool check(bool ok, const std::string &name, const std::string &why = "") {
  if (ok) {
    g_slot->pass++;
    if (g_rank == 0 || g_verbose) std::printf("rank %d: PASS %s\n", g_rank, name.c_str());
  } else {
    g_slot->fail++;
    std::printf("rank %d: FAIL %s: %s\n", g_rank, name.c_str(), why.c_str());
  }
  std::fflush(stdout);
  return ok;
}

// A failed call: the status and the library's message.
struct Error : std::runtime_error {
  fabricoll_status status;
  Error(fabricoll_status s, const char *what)
      : std::runtime_error(std::string(fabricoll_status_string(s)) + " from " + what + ": " +
                           fabricoll_last_error()),
        status(s) {}
};

void ok(fabricoll_status s, const char *what) {
  if (s != FABRICOLL_SUCCESS) throw Error(s, what);
}

template <class T> constexpr int dtype();
template <> constexpr int dtype<float>() { return FABRICOLL_FLOAT32; }
template <> constexpr int dtype<int32_t>() { return FABRICOLL_INT32; }
template <> constexpr int dtype<double>() { return FABRICOLL_FLOAT64; }

// A pending non-blocking call; destroying it waits for it.
class Request {
 public:
  Request() = default;
  explicit Request(fabricoll_request *r) : r_(r) {}
  Request(Request &&o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Request &operator=(Request &&o) noexcept {
    if (this != &o) {
      finish();
      r_ = std::exchange(o.r_, nullptr);
    }
    return *this;
  }
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;
  ~Request() { finish(); }
  bool test() {  // true once complete (the library then frees the request)
    if (!r_) return true;
    int done = 0;
    fabricoll_status s = fabricoll_test(r_, &done);
    if (s != FABRICOLL_SUCCESS) {
      r_ = nullptr;
      throw Error(s, "fabricoll_test");
    }
    if (done) r_ = nullptr;
    return done != 0;
  }
  void wait() {
    if (!r_) return;
    fabricoll_request *r = std::exchange(r_, nullptr);
    ok(fabricoll_wait(r), "fabricoll_wait");
  }

 private:
  void finish() noexcept {
    if (r_) fabricoll_wait(std::exchange(r_, nullptr));
  }
  fabricoll_request *r_ = nullptr;
};

// A communicator; the destructor calls fabricoll_comm_destroy.
class Comm {
 public:
  Comm() = default;
  Comm(int nranks, const fabricoll_unique_id &id, int rank) {
    ok(fabricoll_comm_init_rank(&c_, nranks, &id, rank), "fabricoll_comm_init_rank");
  }
  Comm(Comm &&o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Comm &operator=(Comm &&o) noexcept {
    if (this != &o) {
      reset();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  Comm(const Comm &) = delete;
  Comm &operator=(const Comm &) = delete;
  ~Comm() { reset(); }

  explicit operator bool() const { return c_ != nullptr; }
  fabricoll_comm *get() const { return c_; }
  int rank() const {
    int r = -1;
    ok(fabricoll_comm_rank(c_, &r), "fabricoll_comm_rank");
    return r;
  }
  int size() const {
    int s = -1;
    ok(fabricoll_comm_size(c_, &s), "fabricoll_comm_size");
    return s;
  }
  Comm split(int color, int key) const {
    Comm out;
    ok(fabricoll_comm_split(c_, color, key, &out.c_), "fabricoll_comm_split");
    return out;
  }
  void set_algo(int a) const { ok(fabricoll_comm_set_algo(c_, a), "fabricoll_comm_set_algo"); }

  template <class T> void allreduce(const std::vector<T> &s, std::vector<T> &r, int op) const {
    ok(fabricoll_allreduce(s.data(), r.data(), s.size(), dtype<T>(), op, c_), "fabricoll_allreduce");
  }
  template <class T> void allreduce_inplace(std::vector<T> &b, int op) const {
    ok(fabricoll_allreduce(b.data(), b.data(), b.size(), dtype<T>(), op, c_), "fabricoll_allreduce");
  }
  template <class T> void allgather(const std::vector<T> &s, std::vector<T> &r) const {
    ok(fabricoll_allgather(s.data(), r.data(), s.size(), dtype<T>(), c_), "fabricoll_allgather");
  }
  template <class T> void reducescatter(const std::vector<T> &s, std::vector<T> &r, int op) const {
    ok(fabricoll_reducescatter(s.data(), r.data(), r.size(), dtype<T>(), op, c_), "fabricoll_reducescatter");
  }
  template <class T> void broadcast(const T *s, std::vector<T> &r, int root) const {
    ok(fabricoll_broadcast(s, r.data(), r.size(), dtype<T>(), root, c_), "fabricoll_broadcast");
  }
  template <class T> void reduce(const std::vector<T> &s, T *r, int op, int root) const {
    ok(fabricoll_reduce(s.data(), r, s.size(), dtype<T>(), op, root, c_), "fabricoll_reduce");
  }
  template <class T> void alltoall(const std::vector<T> &s, std::vector<T> &r) const {
    ok(fabricoll_alltoall(s.data(), r.data(), s.size() / size(), dtype<T>(), c_), "fabricoll_alltoall");
  }
  template <class T> Request iallreduce(const std::vector<T> &s, std::vector<T> &r, int op) const {
    fabricoll_request *q = nullptr;
    ok(fabricoll_iallreduce(s.data(), r.data(), s.size(), dtype<T>(), op, c_, &q), "fabricoll_iallreduce");
    return Request(q);
  }
  template <class T> Request iallgather(const std::vector<T> &s, std::vector<T> &r) const {
    fabricoll_request *q = nullptr;
    ok(fabricoll_iallgather(s.data(), r.data(), s.size(), dtype<T>(), c_, &q), "fabricoll_iallgather");
    return Request(q);
  }
  template <class T> Request ibroadcast(const T *s, std::vector<T> &r, int root) const {
    fabricoll_request *q = nullptr;
    ok(fabricoll_ibroadcast(s, r.data(), r.size(), dtype<T>(), root, c_, &q), "fabricoll_ibroadcast");
    return Request(q);
  }
  template <class T> Request isend(const std::vector<T> &b, int peer) const {
    fabricoll_request *q = nullptr;
    ok(fabricoll_isend(b.data(), b.size(), dtype<T>(), peer, c_, &q), "fabricoll_isend");
    return Request(q);
  }
  template <class T> Request irecv(std::vector<T> &b, int peer) const {
    fabricoll_request *q = nullptr;
    ok(fabricoll_irecv(b.data(), b.size(), dtype<T>(), peer, c_, &q), "fabricoll_irecv");
    return Request(q);
  }

 private:
  void reset() noexcept {
    if (c_) fabricoll_comm_destroy(std::exchange(c_, nullptr));
  }
  fabricoll_comm *c_ = nullptr;
};

// Run one named test; an exception is a failed check.
void test(const std::string &name, const std::function<bool()> &f) {
  try {
    check(f(), name, "wrong result");
  } catch (const std::exception &e) {
    check(false, name, e.what());
  }
}

template <class T> bool same(const std::vector<T> &got, const std::vector<T> &want, const char *what) {
  for (size_t i = 0; i < want.size(); i++)
    if (got[i] != want[i]) {
      std::printf("rank %d:   %s: element %zu: got %g, want %g\n", g_rank, what, i, (double)got[i],
                  (double)want[i]);
      return false;
    }
  return got.size() == want.size();
}

float vf(int r, size_t i) { return float((r * 5 + int(i % 1009) * 3) % 13 + 1); }

// An error path: a non-zero status whose last_error names `arg`.
void expect_error(fabricoll_status s, const char *what, const char *arg) {
  std::string e = fabricoll_last_error();
  if (g_rank == 0)
    std::printf("rank 0:   %-36s status %d (%s), last_error \"%s\"\n", what, int(s),
                fabricoll_status_string(int(s)), e.c_str());
  check(s != FABRICOLL_SUCCESS && e.find(arg) != std::string::npos,
        std::string("error path: ") + what + " -> names '" + arg + "'",
        "status " + std::to_string(int(s)) + ", last_error \"" + e + "\"");
}

// Rank 0 makes the unique id and publishes it; the others wait for it (up to deadline).
bool share_id(IdBox *box, fabricoll_unique_id &id, double deadline) {
  if (g_rank == 0) {
    fabricoll_status s = fabricoll_get_unique_id(&id);
    bool ok = check(s == FABRICOLL_SUCCESS, "get_unique_id",
                    std::string(fabricoll_status_string(int(s))) + ": " + fabricoll_last_error());
    if (ok) std::memcpy(&box->id, &id, sizeof id);
    __atomic_store_n(&box->ready, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok;
  }
  while (now_s() < deadline) {
    int r = __atomic_load_n(&box->ready, __ATOMIC_ACQUIRE);
    if (r == 1) {
      std::memcpy(&id, &box->id, sizeof id);
      return true;
    }
    if (r < 0) return check(false, "get_unique_id", "rank 0 could not make the unique id");
    usleep(1000);
  }
  return check(false, "get_unique_id", "rank 0 did not publish the unique id in time");
}

int rank_main(IdBox *box, double deadline) {
  const int n = g_n, me = g_rank;
  fabricoll_unique_id id;
  if (!share_id(box, id, deadline)) return 1;
#ifdef CAPI_ENUM_FALLBACK
  if (me == 0)
    check(false, "include/fabricoll.h defines the datatype/op/algo/coll enums",
          "they are missing from the header; used the values of src/ffi/api.rs");
#endif
  try {
    Comm comm(n, id, me);
    check(comm.rank() == me && comm.size() == n, "Comm: rank and size");
    const size_t c = 1001;
    std::vector<float> want(c);
    for (size_t i = 0; i < c; i++)
      for (int q = 0; q < n; q++) want[i] += vf(q, i);

    test("allreduce<float> sum", [&] {
      std::vector<float> s(c), r(c, -1);
      for (size_t i = 0; i < c; i++) s[i] = vf(me, i);
      comm.allreduce(s, r, FABRICOLL_SUM);
      return same(r, want, "allreduce");
    });
    test("allreduce<float> sum in place", [&] {
      std::vector<float> b(c);
      for (size_t i = 0; i < c; i++) b[i] = vf(me, i);
      comm.allreduce_inplace(b, FABRICOLL_SUM);
      return same(b, want, "allreduce in place");
    });
    test("allreduce<int32_t> max", [&] {
      std::vector<int32_t> s(300), r(300), w(300);
      for (size_t i = 0; i < s.size(); i++) {
        s[i] = int32_t((me * 37 + int(i) * 11) % 97) - 40;
        w[i] = INT32_MIN;
        for (int q = 0; q < n; q++) w[i] = std::max(w[i], int32_t((q * 37 + int(i) * 11) % 97) - 40);
      }
      comm.allreduce(s, r, FABRICOLL_MAX);
      return same(r, w, "allreduce max");
    });
    test("allreduce<double> avg", [&] {
      std::vector<double> s(64), r(64), w(64);
      for (size_t i = 0; i < s.size(); i++) {
        s[i] = me + 0.25 * double(i);
        double t = 0;
        for (int q = 0; q < n; q++) t += q + 0.25 * double(i);
        w[i] = t / n;
      }
      comm.allreduce(s, r, FABRICOLL_AVG);
      for (size_t i = 0; i < s.size(); i++)
        if (std::abs(r[i] - w[i]) > 1e-12 * std::max(1.0, std::abs(w[i]))) return same(r, w, "avg");
      return true;
    });
    test("allgather<int32_t>", [&] {
      const size_t k = 17;
      std::vector<int32_t> s(k), r(k * n), w(k * n);
      for (size_t i = 0; i < k; i++) s[i] = me * 1000 + int(i);
      for (size_t j = 0; j < k * n; j++) w[j] = int(j / k) * 1000 + int(j % k);
      comm.allgather(s, r);
      return same(r, w, "allgather");
    });
    test("reducescatter<float> sum", [&] {
      const size_t k = 23;
      std::vector<float> s(k * n), r(k), w(k);
      for (size_t j = 0; j < k * n; j++) s[j] = vf(me, j);
      for (size_t i = 0; i < k; i++)
        for (int q = 0; q < n; q++) w[i] += vf(q, size_t(me) * k + i);
      comm.reducescatter(s, r, FABRICOLL_SUM);
      return same(r, w, "reducescatter");
    });
    test("broadcast<double> from the last rank", [&] {
      std::vector<double> s(500), r(500, -1);
      for (size_t i = 0; i < s.size(); i++) s[i] = 0.5 * double(i) + (n - 1);
      comm.broadcast(me == n - 1 ? s.data() : nullptr, r, n - 1);
      return same(r, s, "broadcast");
    });
    test("reduce<int32_t> sum to rank 0", [&] {
      std::vector<int32_t> s(200), r(200, -7), w(200);
      for (size_t i = 0; i < s.size(); i++) {
        s[i] = me * 3 + int(i);
        for (int q = 0; q < n; q++) w[i] += q * 3 + int(i);
      }
      comm.reduce(s, me == 0 ? r.data() : nullptr, FABRICOLL_SUM, 0);
      return me != 0 || same(r, w, "reduce");
    });
    test("alltoall<int32_t>", [&] {
      const size_t k = 4;
      std::vector<int32_t> s(k * n), r(k * n, -1), w(k * n);
      for (size_t j = 0; j < k * n; j++) {
        s[j] = me * 100 + int(j);
        w[j] = int(j / k) * 100 + me * int(k) + int(j % k);
      }
      comm.alltoall(s, r);
      return same(r, w, "alltoall");
    });
    test("iallreduce + iallgather + ibroadcast in flight (test polling, wait, RAII)", [&] {
      std::vector<float> s(c), r(c, -1), b(c, -1), bs(c, 3.5f);
      std::vector<int32_t> gs(9, me), gr(9 * n, -1), gw(9 * n);
      for (size_t j = 0; j < gw.size(); j++) gw[j] = int(j / 9);
      for (size_t i = 0; i < c; i++) s[i] = vf(me, i);
      Request a = comm.iallreduce(s, r, FABRICOLL_SUM);
      Request g = comm.iallgather(gs, gr);
      {
        Request bc = comm.ibroadcast(me == 0 ? bs.data() : nullptr, b, 0);
        double deadline = now_s() + 120;
        bool da = false, dg = false;
        while (!(da && dg) && now_s() < deadline) {
          if (!da) da = a.test();
          if (!dg) dg = g.test();
        }
        if (!(da && dg)) throw std::runtime_error("fabricoll_test never reported completion in 120 s");
      }  // ~Request waits for the broadcast
      return same(r, want, "iallreduce") && same(gr, gw, "iallgather") && same(b, bs, "ibroadcast");
    });
    if (n >= 2)
      test("isend/irecv around the ring", [&] {
        std::vector<int32_t> s(256), r(256, -1), w(256);
        int left = (me + n - 1) % n, right = (me + 1) % n;
        for (size_t i = 0; i < s.size(); i++) s[i] = me * 1000 + int(i), w[i] = left * 1000 + int(i);
        Request rr = comm.irecv(r, left);
        Request sr = comm.isend(s, right);
        rr.wait();
        sr.wait();
        return same(r, w, "isend/irecv");
      });
    if (n >= 2)
      test("split even/odd (RAII Comm) + allreduce on each half", [&] {
        Comm half = comm.split(me % 2, me);
        int hn = (n - me % 2 + 1) / 2;
        std::vector<int32_t> s{me}, r{-1};
        half.allreduce(s, r, FABRICOLL_SUM);
        int32_t w = 0;
        for (int q = me % 2; q < n; q += 2) w += q;
        return half.size() == hn && half.rank() == me / 2 && r[0] == w;
      });  // ~Comm destroys the half
    for (int a : {FABRICOLL_ALGO_RING, FABRICOLL_ALGO_RDH}) {
      test(std::string("fabricoll_collective allreduce, per-call algo ") + (a == FABRICOLL_ALGO_RING ? "ring" : "rdh"), [&] {
        std::vector<float> s(c), r(c, -1);
        for (size_t i = 0; i < c; i++) s[i] = vf(me, i);
        fabricoll_call call{FABRICOLL_COLL_ALLREDUCE, s.data(), r.data(), c, FABRICOLL_FLOAT32, FABRICOLL_SUM, 0, a};
        ok(fabricoll_collective(&call, comm.get(), nullptr), "fabricoll_collective");
        return same(r, want, "collective");
      });
    }
    test("set_algo ring + allreduce", [&] {
      comm.set_algo(FABRICOLL_ALGO_RING);
      std::vector<float> s(c), r(c, -1);
      for (size_t i = 0; i < c; i++) s[i] = vf(me, i);
      comm.allreduce(s, r, FABRICOLL_SUM);
      comm.set_algo(FABRICOLL_ALGO_AUTO);
      return same(r, want, "set_algo");
    });
    {
      float s[8] = {}, r[8 * kMaxRanks] = {};
      auto *garbage = reinterpret_cast<fabricoll_comm *>(uintptr_t{0x1234});
      expect_error(fabricoll_allreduce(s, r, 8, FABRICOLL_FLOAT32, FABRICOLL_SUM, nullptr), "NULL comm", "comm");
      expect_error(fabricoll_allreduce(s, r, 8, FABRICOLL_FLOAT32, FABRICOLL_SUM, garbage), "comm 0x1234", "comm");
      expect_error(fabricoll_allreduce(s, r, 8, 99, FABRICOLL_SUM, comm.get()), "datatype 99", "datatype");
      expect_error(fabricoll_allreduce(s, r, 8, FABRICOLL_FLOAT32, 77, comm.get()), "op 77", "op");
      expect_error(fabricoll_broadcast(s, r, 8, FABRICOLL_FLOAT32, n + 3, comm.get()), "broadcast root n+3", "root");
      expect_error(fabricoll_allreduce(nullptr, r, 8, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm.get()), "NULL sendbuf, count 8", "sendbuf");
      try {  // the wrapper turns the status into an exception carrying the message
        comm.set_algo(1000);
        check(false, "Error exception from set_algo(1000)", "no exception");
      } catch (const Error &e) {
        check(std::strstr(e.what(), "algo") != nullptr, "Error exception from set_algo(1000)", e.what());
      }
    }
    test("allreduce after the error paths", [&] {
      std::vector<float> s(c), r(c, -1);
      for (size_t i = 0; i < c; i++) s[i] = vf(me, i);
      comm.allreduce(s, r, FABRICOLL_SUM);
      return same(r, want, "allreduce after errors");
    });
  } catch (const std::exception &e) {  // e.g. init failed
    check(false, "rank setup", e.what());
  }  // ~Comm: fabricoll_comm_destroy
  return g_slot->fail ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  int n = 4;
  double timeout_s = 180;
  g_verbose = std::getenv("CAPI_VERBOSE") && std::atoi(std::getenv("CAPI_VERBOSE"));
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "-n" && i + 1 < argc) n = std::atoi(argv[++i]);
    else if (a == "-t" && i + 1 < argc) timeout_s = std::atof(argv[++i]);
    else if (a == "-v") g_verbose = true;
    else {
      std::fprintf(stderr, "usage: %s [-n NRANKS (1..%d, default 4)] [-t TIMEOUT_S (180)] [-v]\n", argv[0], kMaxRanks);
      return 2;
    }
  }
  if (n < 1 || n > kMaxRanks) {
    std::fprintf(stderr, "capi_example: -n must be 1..%d\n", kMaxRanks);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("capi_example (C++): fabricoll %s, %d ranks, provider %s\n", fabricoll_version(), n,
              std::getenv("FABRICOLL_PROVIDER") ? std::getenv("FABRICOLL_PROVIDER") : "(default)");
  const size_t map_len = sizeof(Slot) * (kMaxRanks + 1) + sizeof(IdBox);
  void *m = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  std::memset(m, 0, map_len);
  auto *slots = static_cast<Slot *>(m);
  auto *box = reinterpret_cast<IdBox *>(slots + kMaxRanks + 1);
  g_n = n, g_slot = &slots[kMaxRanks];
  std::fflush(stdout);
  std::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the parent before it reaps
  const pid_t parent = getpid();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p < 0) {
      std::perror("fork");
      for (pid_t k : pids) kill(k, SIGKILL);
      return 1;
    }
    if (p == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a rank never outlives the parent
      if (getppid() != parent) _exit(4);
      g_rank = r, g_slot = &slots[r];
      int rc = rank_main(box, now_s() + timeout_s);
      g_slot->finished = 1;
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(p);
  }
  std::vector<int> status(n, 0), exited(n, 0);
  int alive = n;
  double deadline = now_s() + timeout_s;
  while (alive > 0 && now_s() < deadline) {
    for (int r = 0; r < n; r++)
      if (!exited[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) exited[r] = 1, alive--;
    if (alive > 0) usleep(20000);
  }
  for (int r = 0; r < n; r++)
    if (!exited[r]) kill(pids[r], SIGKILL);
  for (int r = 0; r < n; r++)
    if (!exited[r]) waitpid(pids[r], &status[r], 0);
  int pass = 0, fail = 0;
  for (int r = 0; r < n; r++) {
    if (!exited[r]) {
      std::printf("FAIL rank %d: still running after %g s (-t): killed\n", r, timeout_s);
      fail++;
    } else if (WIFSIGNALED(status[r])) {
      std::printf("FAIL rank %d: killed by signal %d\n", r, WTERMSIG(status[r]));
      fail++;
    } else if (!slots[r].finished) {
      std::printf("FAIL rank %d: exited with %d before finishing\n", r, WEXITSTATUS(status[r]));
      fail++;
    }
    pass += slots[r].pass;
    fail += slots[r].fail;
  }
  std::printf("capi_example: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
}
