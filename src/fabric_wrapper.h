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
