// The C API's send, receive and collective exports, as one table that is read twice: by
// `c_exports!` in exports.rs, which writes each export as a function of the library, and by
// `c_exports!` in build.rs, which writes each one's declaration for cbindgen (cbindgen writes
// include/fabricoll.h and does not expand macros). The header lists them in this order.
//
// An entry: the blocking export's doc; optionally the non-blocking one's (else the template
// below); `fn` and the names of the blocking, non-blocking and (where the call takes device
// buffers) stream-ordered exports; the arguments before `comm`; and the expression that gathers
// them into the call's arguments (`collectives::Args`, `varied::VArgs`, `varied::Tagged`).
// Every export makes one call into `collectives` (`blocking`, `nonblocking`, `stream_ordered`),
// where the panic boundary and the checks are.
c_exports! {
    nonblocking_doc: " Non-blocking ", ": `*request` completes through fabricoll_test / fabricoll_wait.";
    stream_doc: " Stream-ordered ", ": returns at once; runs after the work already on `stream` (a CUstream; never the legacy NULL stream), and later work on `stream` waits for it. The buffers may be device memory or page-locked host memory and must stay valid until the stream has passed the call. A failure after the return releases the stream and is reported by fabricoll_comm_get_async_error.";

    /// recvbuf = the reduction of every rank's sendbuf (count elements each; in place when the buffers are equal).
    fn fabricoll_allreduce, fabricoll_iallreduce, fabricoll_allreduce_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, datatype: c_int, op: c_int,
    ) => Args::coll(AllReduce, sendbuf, recvbuf, count, datatype).op(op);

    /// recvbuf (nranks x sendcount) = every rank's sendbuf, in rank order.
    fn fabricoll_allgather, fabricoll_iallgather, fabricoll_allgather_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, sendcount: usize, datatype: c_int,
    ) => Args::coll(AllGather, sendbuf, recvbuf, sendcount, datatype);

    /// recvbuf (recvcount) = block `rank` of the reduction of every rank's sendbuf (nranks x recvcount).
    fn fabricoll_reducescatter, fabricoll_ireducescatter, fabricoll_reducescatter_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: usize, datatype: c_int, op: c_int,
    ) => Args::coll(ReduceScatter, sendbuf, recvbuf, recvcount, datatype).op(op);

    /// recvbuf = the root's sendbuf on every rank (sendbuf is read on the root only and may be NULL elsewhere).
    fn fabricoll_broadcast, fabricoll_ibroadcast, fabricoll_broadcast_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, datatype: c_int, root: c_int,
    ) => Args::coll(Broadcast, sendbuf, recvbuf, count, datatype).root(root);

    /// The root's recvbuf = the reduction of every rank's sendbuf (recvbuf is written on the root only and may be NULL elsewhere).
    fn fabricoll_reduce, fabricoll_ireduce, fabricoll_reduce_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, datatype: c_int, op: c_int,
        root: c_int,
    ) => Args::coll(Reduce, sendbuf, recvbuf, count, datatype).op(op).root(root);

    /// Block j (count elements) of rank i's sendbuf lands as block i of rank j's recvbuf.
    fn fabricoll_alltoall, fabricoll_ialltoall, fabricoll_alltoall_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, datatype: c_int,
    ) => Args::coll(AllToAll, sendbuf, recvbuf, count, datatype);

    /// Send count elements to `peer` (matched in order with its fabricoll_recv from this rank).
    #[nonblocking_doc = " Non-blocking fabricoll_send."]
    fn fabricoll_send, fabricoll_isend, fabricoll_send_stream(
        buf: *const c_void, count: usize, datatype: c_int, peer: c_int,
    ) => Args::p2p(true, buf as *mut c_void, count, datatype, peer);

    /// Receive count elements from `peer`.
    #[nonblocking_doc = " Non-blocking fabricoll_recv."]
    fn fabricoll_recv, fabricoll_irecv, fabricoll_recv_stream(
        buf: *mut c_void, count: usize, datatype: c_int, peer: c_int,
    ) => Args::p2p(false, buf, count, datatype, peer);

    /// Every rank's sendbuf (sendcount elements) lands in rank order in the root's recvbuf (nranks x sendcount; written on the root only, may be NULL elsewhere).
    fn fabricoll_gather, fabricoll_igather, fabricoll_gather_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, sendcount: usize, datatype: c_int, root: c_int,
    ) => VArgs::rooted(false, sendbuf, recvbuf, sendcount, datatype, root);

    /// Block i (recvcount elements) of the root's sendbuf (nranks x recvcount; read on the root only, may be NULL elsewhere) lands in rank i's recvbuf.
    fn fabricoll_scatter, fabricoll_iscatter, fabricoll_scatter_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: usize, datatype: c_int, root: c_int,
    ) => VArgs::rooted(true, sendbuf, recvbuf, recvcount, datatype, root);

    /// Completes once every rank has called it.
    fn fabricoll_barrier, fabricoll_ibarrier()
        => VArgs::new(Varied::Barrier, std::ptr::null(), std::ptr::null_mut(), 0);

    /// recvbuf + displs[i] (recvcounts[i] elements) = rank i's sendbuf; sendcount must equal recvcounts[rank]. recvcounts (nranks values, the same on every rank) must not be NULL; displs NULL packs the blocks in rank order. The arrays are read before the call returns.
    fn fabricoll_allgatherv, fabricoll_iallgatherv, fabricoll_allgatherv_stream(
        sendbuf: *const c_void, sendcount: usize, recvbuf: *mut c_void, recvcounts: *const usize,
        displs: *const usize, datatype: c_int,
    ) => VArgs::allgatherv(sendbuf, sendcount, recvbuf, recvcounts, displs, datatype);

    /// recvbuf (recvcounts[rank] elements) = block `rank` of the reduction of every rank's sendbuf, whose blocks are recvcounts[0..nranks] packed. recvcounts (the same on every rank) must not be NULL; it is read before the call returns.
    fn fabricoll_reducescatterv, fabricoll_ireducescatterv, fabricoll_reducescatterv_stream(
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const usize, datatype: c_int,
        op: c_int,
    ) => VArgs::reducescatterv(sendbuf, recvbuf, recvcounts, datatype, op);

    /// sendbuf + sdispls[j] (sendcounts[j] elements) goes to rank j, landing at its recvbuf + rdispls[i] (recvcounts[i]) for this rank i. The counts arrays must not be NULL; a NULL displacements array packs its blocks in rank order. The arrays are read before the call returns.
    fn fabricoll_alltoallv, fabricoll_ialltoallv(
        sendbuf: *const c_void, sendcounts: *const usize, sdispls: *const usize,
        recvbuf: *mut c_void, recvcounts: *const usize, rdispls: *const usize, datatype: c_int,
    ) => VArgs::alltoallv([sendcounts, sdispls, recvcounts, rdispls], sendbuf, recvbuf, datatype);

    /// Send count elements to `peer` with `tag` (0 ..= FABRICOLL_MAX_TAG), matched in order with its receives of that tag from this rank (fabricoll_send is tag 0).
    fn fabricoll_send_tagged, fabricoll_isend_tagged, fabricoll_send_tagged_stream(
        buf: *const c_void, count: usize, datatype: c_int, peer: c_int, tag: c_int,
    ) => Tagged { send: true, buf: buf as *mut c_void, count, datatype, peer, tag };

    /// Receive count elements from `peer` with `tag` (fabricoll_recv is tag 0).
    fn fabricoll_recv_tagged, fabricoll_irecv_tagged, fabricoll_recv_tagged_stream(
        buf: *mut c_void, count: usize, datatype: c_int, peer: c_int, tag: c_int,
    ) => Tagged { send: false, buf, count, datatype, peer, tag };
}
