/* Every libfabric header the transport uses; build.rs runs bindgen over this file and compiles
 * the wrappers it generates for the static inline functions (fi_tsend, fi_cq_read, ...). */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* fi_mr_regattr of `len` bytes of CUDA device memory at `addr` on CUDA device `device`. Written in
 * C because struct fi_mr_attr differs between releases (1.20 put mr_iov in an anonymous union
 * with dmabuf, which bindgen names differently per release); C names the fields the same way on
 * every release. */
static inline int fi_fabricoll_regattr_cuda(struct fid_domain *domain, void *addr, size_t len,
                                            uint64_t access, int device, struct fid_mr **mr)
{
	struct iovec iov = { .iov_base = addr, .iov_len = len };
	struct fi_mr_attr attr = { 0 };

	attr.mr_iov = &iov;
	attr.iov_count = 1;
	attr.access = access;
	attr.iface = FI_HMEM_CUDA;
	attr.device.cuda = device;
	return fi_mr_regattr(domain, &attr, 0, mr);
}
