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

/* fi_mr_regattr of `len` bytes of CUDA device memory at `addr` on CUDA device `device`: by
 * address, or (`dmabuf_fd` >= 0) through that dma-buf, `dmabuf_offset` bytes into it. Written in
 * C because struct fi_mr_attr differs between releases (1.20 put mr_iov in an anonymous union
 * with dmabuf, which bindgen names differently per release); C names the fields the same way on
 * every release. libfabric has FI_MR_DMABUF from 1.20: built against older headers, a dma-buf
 * gets -FI_EOPNOTSUPP. */
static inline int fi_fabricoll_regattr_cuda(struct fid_domain *domain, void *addr, size_t len,
					    uint64_t access, int device, int dmabuf_fd,
					    uint64_t dmabuf_offset, uint64_t requested_key,
					    struct fid_mr **mr)
{
	struct iovec iov = { .iov_base = addr, .iov_len = len };
	struct fi_mr_attr attr = { 0 };
	uint64_t flags = 0;
#ifdef FI_MR_DMABUF
	/* base_addr: where the dma-buf's first byte is mapped */
	struct fi_mr_dmabuf dmabuf = { .fd = dmabuf_fd, .offset = dmabuf_offset, .len = len,
				       .base_addr = (char *)addr - dmabuf_offset };
#endif

	attr.mr_iov = &iov;
	attr.iov_count = 1;
	attr.access = access;
	attr.requested_key = requested_key;
	attr.iface = FI_HMEM_CUDA;
	attr.device.cuda = device;
	if (dmabuf_fd >= 0) {
#ifdef FI_MR_DMABUF
		attr.dmabuf = &dmabuf;
		flags = FI_MR_DMABUF;
#else
		(void)dmabuf_offset;
		return -FI_EOPNOTSUPP;
#endif
	}
	return fi_mr_regattr(domain, &attr, flags, mr);
}
