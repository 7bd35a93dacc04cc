/*
 * rma_raw: raw libfabric RMA between two local processes, the baseline for neuron_bench's
 * iwrite / iread rows (Debian packages no fabtests, so no fi_rma_bw).
 *
 *   rma_raw [-p tcp|net|shm] [-d DOMAIN] [-o write,read,send] [-c auto|delivery|default] [--probe]
 *           [-b MIN] [-e MAX] [-f FACTOR] [-s SIZE,SIZE..] [-t SECS] [-w WINDOW] [--timeout-ms MS]
 *
 * Each rank opens an RDM endpoint on the provider (tcp = 'tcp;ofi_rxm'; -d defaults to lo for
 * tcp and net) with the mr_mode hints the plugin uses (FI_MR_VIRT_ADDR | FI_MR_PROV_KEY |
 * FI_MR_ALLOCATED | FI_MR_LOCAL), registers a send and a receive buffer for local and remote
 * access, and exchanges its address, keys and buffer addresses (offsets when the provider did not
 * grant FI_MR_VIRT_ADDR) with the other through a shared mapping. Rank 0 then measures fi_write
 * into rank 1's receive buffer and fi_read from rank 1's send buffer (send: fi_send / fi_recv),
 * with bench_core's loops and table (bench_core.h). -c: when a write completes. delivery: in the
 * peer's memory (fi_writemsg with FI_DELIVERY_COMPLETE); default: the provider's default, which on
 * tcp and net is once sent; auto (the default): delivery on tcp and net, default on shm (whose
 * writes are copies complete when posted), the promise the plugin's iwrite keeps, so that the
 * two are compared like for like. Lines starting with '#' describe what the provider granted. --probe prints them and exits: 0 when the provider offers RMA, 3 when not.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_core.h"

#define NSLOTS (2 * BENCH_MAXWINDOW + 8)
#define MR_HINTS (FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_LOCAL)

static const char* g_prov = "tcp";
static const char* g_domain;
static int g_probe;
static const char* g_completion = "auto";
static uint64_t g_write_flags; /* FI_DELIVERY_COMPLETE or 0, from -c */
static enum bench_op g_ops[4] = {BOP_WRITE, BOP_READ};
static int g_nops = 2;
static const char* USAGE =
    "rma_raw [-p tcp|net|shm] [-d DOMAIN] [-o write,read,send] [-c auto|delivery|default] [--probe] [-b MIN] [-e MAX] [-f FACTOR]"
    " [-s SIZE,..] [-t SECS] [-w WINDOW] [--timeout-ms MS]";

typedef struct {
  struct fi_context2 fctx; /* first: libfabric hands it back as op_context */
  int busy, done;
  size_t len;
} slot_t;

typedef struct {
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_cq* cq;
  struct fid_av* av;
  struct fid_ep* ep;
  struct fid_mr *smr, *rmr;
  void *sdesc, *rdesc;
  fi_addr_t peer;
  uint64_t peer_saddr, peer_raddr, peer_skey, peer_rkey;
  slot_t slots[NSLOTS];
  int next;
} raw_t;

/* What the ranks exchange. */
typedef struct {
  uint64_t saddr, raddr, skey, rkey;
  size_t namelen;
  char name[256];
} card_t;

static int extra_opt(const char* a, const char* v) {
  if (!strcmp(a, "--probe")) return g_probe = 1, 0;
  if (!v) return fprintf(stderr, "rma_raw: %s needs a value\n", a), -1;
  if (!strcmp(a, "-p")) {
    if (strcmp(v, "tcp") && strcmp(v, "net") && strcmp(v, "shm"))
      return fprintf(stderr, "rma_raw: -p '%s': expected tcp, net or shm\n", v), -1;
    g_prov = v;
  } else if (!strcmp(a, "-c")) {
    if (strcmp(v, "auto") && strcmp(v, "delivery") && strcmp(v, "default"))
      return fprintf(stderr, "rma_raw: -c '%s': expected auto, delivery or default\n", v), -1;
    g_completion = v;
  } else if (!strcmp(a, "-d")) {
    g_domain = v;
  } else if (!strcmp(a, "-o")) {
    static const enum bench_op allowed[] = {BOP_WRITE, BOP_READ, BOP_SEND};
    g_nops = bench_parse_ops("rma_raw", v, allowed, 3, g_ops, 4);
    if (g_nops < 0) return -1;
  } else {
    return fprintf(stderr, "rma_raw: unknown argument %s\n", a), -1;
  }
  return 1;
}

static void mr_mode_str(uint64_t m, char* out, size_t len) {
  static const struct { uint64_t bit; const char* name; } names[] = {
      {FI_MR_LOCAL, "LOCAL"},       {FI_MR_RAW, "RAW"},         {FI_MR_VIRT_ADDR, "VIRT_ADDR"},
      {FI_MR_ALLOCATED, "ALLOCATED"}, {FI_MR_PROV_KEY, "PROV_KEY"}, {FI_MR_MMU_NOTIFY, "MMU_NOTIFY"},
      {FI_MR_RMA_EVENT, "RMA_EVENT"}, {FI_MR_ENDPOINT, "ENDPOINT"}, {FI_MR_HMEM, "HMEM"}};
  size_t n = 0;
  out[0] = 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (m & names[i].bit) n += (size_t)snprintf(out + n, n < len ? len - n : 0, "%s%s", n ? "|" : "", names[i].name);
  if (!n) snprintf(out, len, "none");
}

/* fi_getinfo with the plugin's hints; NULL (with a line on stdout) when the provider has no RMA. */
static struct fi_info* get_info(int print) {
  struct fi_info* hints = fi_allocinfo();
  if (!hints) return fprintf(stderr, "rma_raw: fi_allocinfo failed\n"), NULL;
  hints->caps = FI_MSG | FI_RMA;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = MR_HINTS;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->fabric_attr->prov_name = strdup(!strcmp(g_prov, "tcp") ? "tcp;ofi_rxm" : g_prov);
  const char* dom = g_domain ? g_domain : strcmp(g_prov, "shm") ? "lo" : NULL;
  if (dom) hints->domain_attr->name = strdup(dom);
  struct fi_info* info = NULL;
  int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
  fi_freeinfo(hints);
  /* the domain hint does not filter under ofi_rxm: pick the first entry of that domain */
  struct fi_info* pick = info;
  while (!rc && dom && pick && strcmp(pick->domain_attr->name, dom)) pick = pick->next;
  if (rc || !pick) {
    if (print)
      printf("# rma_raw: provider %s domain %s: no RDM endpoint with FI_RMA (%s)\n", g_prov, dom ? dom : "-",
             rc ? fi_strerror(-rc) : "no entry of that domain");
    if (info) fi_freeinfo(info);
    return NULL;
  }
  if (pick != info) {
    pick = fi_dupinfo(pick);
    fi_freeinfo(info);
    info = pick;
    if (!info) return fprintf(stderr, "rma_raw: fi_dupinfo failed\n"), NULL;
  }
  if (print) {
    char granted[160], asked[160];
    mr_mode_str((uint64_t)info->domain_attr->mr_mode, granted, sizeof granted);
    mr_mode_str(MR_HINTS, asked, sizeof asked);
    printf("# rma_raw: provider %s, fabric %s, domain %s\n", info->fabric_attr->prov_name, info->fabric_attr->name,
           info->domain_attr->name);
    printf("# mr_mode asked %s, granted %s; mr_key_size %zu; inject_size %zu (fi_inject_write limit)\n", asked, granted,
           info->domain_attr->mr_key_size, info->tx_attr->inject_size);
    printf("# write completion: %s\n", g_write_flags ? "delivery (FI_DELIVERY_COMPLETE)" : "the provider's default");
    printf("# remote addresses: %s\n", info->domain_attr->mr_mode & FI_MR_VIRT_ADDR
                                            ? "virtual addresses (FI_MR_VIRT_ADDR)"
                                            : "0-based offsets into the peer's registration (no FI_MR_VIRT_ADDR)");
    fflush(stdout);
  }
  return info;
}

static int ficheck(bench_t* b, const char* what, int rc) {
  return rc ? bench_fail(b, "%s failed: %d (%s)", what, rc, fi_strerror(-rc)) : 0;
}

/* Reads completions, marking their slots done; -1 after reporting a failed one. */
static int poll_cq(bench_t* b) {
  raw_t* x = b->ctx;
  struct fi_cq_data_entry e[16];
  ssize_t n = fi_cq_read(x->cq, e, 16);
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    struct fi_cq_err_entry err = {0};
    fi_cq_readerr(x->cq, &err, 0);
    return bench_fail(b, "completion failed: %s (%s)", fi_strerror(err.err),
                      fi_cq_strerror(x->cq, err.prov_errno, err.err_data, NULL, 0));
  }
  if (n < 0) return bench_fail(b, "fi_cq_read: %s", fi_strerror((int)-n));
  for (ssize_t i = 0; i < n; i++) {
    slot_t* s = e[i].op_context;
    if (!s) continue;
    if (e[i].flags & FI_RECV) s->len = e[i].len;
    s->done = 1;
  }
  return 0;
}

static int raw_post(bench_t* b, enum bench_op op, size_t size, void** tok) {
  raw_t* x = b->ctx;
  slot_t* s = NULL;
  for (int i = 0; i < NSLOTS && !s; i++, x->next = (x->next + 1) % NSLOTS)
    if (!x->slots[x->next].busy) s = &x->slots[x->next];
  if (!s) return poll_cq(b) ? -1 : 1;
  *s = (slot_t){.busy = 1, .len = size};
  unsigned char *sb = b->sbuf, *rb = b->rbuf;
  unsigned char *sctl = sb + b->cap - BENCH_CTL_BYTES, *rctl = rb + b->cap - BENCH_CTL_BYTES;
  ssize_t rc;
  switch (op) {
  case BOP_WRITE: {
    struct iovec iov = {sb, size};
    struct fi_rma_iov rma = {x->peer_raddr, size, x->peer_rkey};
    struct fi_msg_rma msg = {.msg_iov = &iov, .desc = &x->sdesc, .iov_count = 1, .addr = x->peer,
                             .rma_iov = &rma, .rma_iov_count = 1, .context = s};
    rc = g_write_flags ? fi_writemsg(x->ep, &msg, g_write_flags)
                       : fi_write(x->ep, sb, size, x->sdesc, x->peer, x->peer_raddr, x->peer_rkey, s);
    break;
  }
  case BOP_READ: rc = fi_read(x->ep, rb, size, x->rdesc, x->peer, x->peer_saddr, x->peer_skey, s); break;
  case BOP_SEND: rc = fi_send(x->ep, sb, size, x->sdesc, x->peer, s); break;
  case BOP_RECV: rc = fi_recv(x->ep, rb, size, x->rdesc, FI_ADDR_UNSPEC, s); break;
  case BOP_CTL_SEND: rc = fi_send(x->ep, sctl, 1, x->sdesc, x->peer, s); break;
  case BOP_CTL_RECV: rc = fi_recv(x->ep, rctl, 1, x->rdesc, FI_ADDR_UNSPEC, s); break;
  default: s->busy = 0; return bench_fail(b, "rma_raw: op %s not supported", bench_op_name(op));
  }
  if (rc == -FI_EAGAIN) {
    s->busy = 0;
    return poll_cq(b) ? -1 : 1;
  }
  if (rc) {
    s->busy = 0;
    return bench_fail(b, "%s(%zu B) failed: %s", bench_op_name(op), size, fi_strerror((int)-rc));
  }
  *tok = s;
  return 0;
}

static int raw_test(bench_t* b, void* tok, int* done, size_t* bytes) {
  slot_t* s = tok;
  if (!s->done && poll_cq(b)) return -1;
  *done = s->done;
  if (s->done) *bytes = s->len, s->busy = 0;
  return 0;
}

static const bench_ops_t RAW_OPS = {raw_post, raw_test};

static int reg(bench_t* b, void* buf, uint64_t key, struct fid_mr** mr, void** desc) {
  raw_t* x = b->ctx;
  uint64_t access = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  if (ficheck(b, "fi_mr_reg", fi_mr_reg(x->domain, buf, b->cap, access, 0, key, 0, mr, NULL))) return -1;
  *desc = fi_mr_desc(*mr);
  return 0;
}

static int setup(bench_t* b, raw_t* x) {
  x->info = get_info(b->rank == 0);
  if (!x->info) return bench_fail(b, "provider %s offers no RDM endpoint with FI_RMA", g_prov);
  struct fi_info* i = x->info;
  struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_DATA, .size = 1024};
  struct fi_av_attr ava = {.type = FI_AV_TABLE};
  if (ficheck(b, "fi_fabric", fi_fabric(i->fabric_attr, &x->fabric, NULL)) ||
      ficheck(b, "fi_domain", fi_domain(x->fabric, i, &x->domain, NULL)) ||
      ficheck(b, "fi_cq_open", fi_cq_open(x->domain, &cqa, &x->cq, NULL)) ||
      ficheck(b, "fi_av_open", fi_av_open(x->domain, &ava, &x->av, NULL)) ||
      ficheck(b, "fi_endpoint", fi_endpoint(x->domain, i, &x->ep, NULL)) ||
      ficheck(b, "fi_ep_bind(cq)", fi_ep_bind(x->ep, &x->cq->fid, FI_TRANSMIT | FI_RECV)) ||
      ficheck(b, "fi_ep_bind(av)", fi_ep_bind(x->ep, &x->av->fid, 0)) || ficheck(b, "fi_enable", fi_enable(x->ep)))
    return -1;
  if (bench_alloc(b)) return -1;
  uint64_t mode = (uint64_t)i->domain_attr->mr_mode;
  if (mode & FI_MR_ENDPOINT) return bench_fail(b, "provider needs FI_MR_ENDPOINT, which was not asked for");
  /* requested keys only matter without FI_MR_PROV_KEY; one domain per process, so 1 and 2 are unique */
  if (reg(b, b->sbuf, 1, &x->smr, &x->sdesc) || reg(b, b->rbuf, 2, &x->rmr, &x->rdesc)) return -1;
  card_t me = {0}, peer;
  me.namelen = sizeof me.name;
  if (ficheck(b, "fi_getname", fi_getname(&x->ep->fid, me.name, &me.namelen))) return -1;
  int virt = (mode & FI_MR_VIRT_ADDR) != 0;
  me.saddr = virt ? (uint64_t)(uintptr_t)b->sbuf : 0;
  me.raddr = virt ? (uint64_t)(uintptr_t)b->rbuf : 0;
  me.skey = fi_mr_key(x->smr);
  me.rkey = fi_mr_key(x->rmr);
  if (me.skey == FI_KEY_NOTAVAIL || me.rkey == FI_KEY_NOTAVAIL) return bench_fail(b, "fi_mr_key: key not available");
  if (bench_exchange(b, &me, sizeof me, &peer)) return -1;
  if (fi_av_insert(x->av, peer.name, 1, &x->peer, 0, NULL) != 1)
    return bench_fail(b, "fi_av_insert of the peer's address failed");
  x->peer_saddr = peer.saddr, x->peer_raddr = peer.raddr, x->peer_skey = peer.skey, x->peer_rkey = peer.rkey;
  return 0;
}

static void teardown(raw_t* x) {
  struct fid* fids[] = {x->ep ? &x->ep->fid : NULL, x->smr ? &x->smr->fid : NULL, x->rmr ? &x->rmr->fid : NULL,
                        x->av ? &x->av->fid : NULL, x->cq ? &x->cq->fid : NULL, x->domain ? &x->domain->fid : NULL,
                        x->fabric ? &x->fabric->fid : NULL};
  for (size_t k = 0; k < sizeof fids / sizeof fids[0]; k++)
    if (fids[k]) fi_close(fids[k]);
  if (x->info) fi_freeinfo(x->info);
}

static int rank_main(bench_t* b) {
  raw_t* x = calloc(1, sizeof *x);
  if (!x) return bench_fail(b, "out of memory");
  b->ctx = x;
  b->ops = &RAW_OPS;
  size_t limit[4] = {(size_t)-1, (size_t)-1, (size_t)-1, (size_t)-1};
  int rc = setup(b, x) || bench_run(b, g_ops, limit, g_nops);
  teardown(x);
  free(x);
  return rc ? -1 : 0;
}

int main(int argc, char** argv) {
  bench_cfg_t cfg;
  int rc = bench_parse(argc, argv, &cfg, "rma_raw", USAGE, extra_opt);
  if (rc) return rc == 1 ? 0 : rc;
  int delivery = !strcmp(g_completion, "delivery") || (!strcmp(g_completion, "auto") && strcmp(g_prov, "shm"));
  g_write_flags = delivery ? FI_DELIVERY_COMPLETE : 0;
  if (g_probe) {
    struct fi_info* info = get_info(1);
    if (!info) return 3;
    fi_freeinfo(info);
    return 0;
  }
  return bench_fork(&cfg, "rma_raw", rank_main);
}
