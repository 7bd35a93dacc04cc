//! Max-min sharing's known cases: two and three flows, shared and disjoint links, and a
//! token-bucket link's burst.
use super::*;

fn rate(l: &mut Links, token: u32) -> f64 {
    l.rates().into_iter().find(|r| r.0 == token).unwrap().1
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

/// Two flows on one link of 10: 5 each; when one ends the other gets all 10.
#[test]
fn two_flows_one_link() {
    let mut l = Links::new();
    let a = l.add(10.0);
    l.start(&[a], 50.0, 1);
    l.start(&[a], 100.0, 2);
    assert!(close(rate(&mut l, 1), 5.0) && close(rate(&mut l, 2), 5.0));
    // Once flow 1 ends, flow 2 has the whole link.
    let t = l.next_finish().unwrap();
    assert!(close(t, 10.0), "{t}");
    let mut done = Vec::new();
    l.advance(t);
    l.take_finished(t, &mut done);
    assert_eq!(done, vec![1]);
    assert!(close(rate(&mut l, 2), 10.0));
    assert!(close(l.next_finish().unwrap(), 15.0));
}

/// Two flows on different bottlenecks: A crosses links x (cap 4) and y (cap 10), B only y.
/// x limits A to 4; B takes the remaining 6 of y (not the equal split of 5).
#[test]
fn two_flows_different_bottlenecks() {
    let mut l = Links::new();
    let x = l.add(4.0);
    let y = l.add(10.0);
    l.start(&[x, y], 1.0, 1);
    l.start(&[y], 1.0, 2);
    assert!(close(rate(&mut l, 1), 4.0));
    assert!(close(rate(&mut l, 2), 6.0));
}

/// The textbook three-flow line: links p and q of capacity 1; flow 0 crosses both, flow 1
/// only p, flow 2 only q: each gets 1/2. With q of capacity 2: flow 0 and flow 1 share p at
/// 1/2 each, and flow 2 takes q's remaining 3/2.
#[test]
fn three_flows_line() {
    let mut l = Links::new();
    let p = l.add(1.0);
    let q = l.add(1.0);
    l.start(&[p, q], 1.0, 0);
    l.start(&[p], 1.0, 1);
    l.start(&[q], 1.0, 2);
    for t in 0..3 {
        assert!(close(rate(&mut l, t), 0.5));
    }
    let mut l = Links::new();
    let p = l.add(1.0);
    let q = l.add(2.0);
    l.start(&[p, q], 1.0, 0);
    l.start(&[p], 1.0, 1);
    l.start(&[q], 1.0, 2);
    assert!(close(rate(&mut l, 0), 0.5));
    assert!(close(rate(&mut l, 1), 0.5));
    assert!(close(rate(&mut l, 2), 1.5));
}

/// Three flows out of one sender's egress (cap 9) to three receivers whose ingress links
/// are 2, 9 and 9: the first is held to 2, the other two split the remaining 7.
#[test]
fn three_flows_egress_and_ingress() {
    let mut l = Links::new();
    let out = l.add(9.0);
    let ins: Vec<LinkId> = [2.0, 9.0, 9.0].iter().map(|&c| l.add(c)).collect();
    for (t, &i) in ins.iter().enumerate() {
        l.start(&[out, i], 1.0, t as u32);
    }
    assert!(close(rate(&mut l, 0), 2.0));
    assert!(close(rate(&mut l, 1), 3.5));
    assert!(close(rate(&mut l, 2), 3.5));
}

/// Flows over the same links share one class: a flow that joins later, and smaller, ends
/// first, each at its own count of bytes. Link of 10; A 100 bytes from 0; at 5 (A has 50
/// left) B of 20 joins: 5 each, B ends at 9, A (30 left) at 12 alone at 10.
#[test]
fn flows_of_one_class_end_by_their_own_bytes() {
    let mut l = Links::new();
    let a = l.add(10.0);
    l.start(&[a], 100.0, 1);
    assert!(close(l.next_finish().unwrap(), 10.0));
    l.advance(5.0);
    l.start(&[a], 20.0, 2);
    let mut done = Vec::new();
    let t = l.next_finish().unwrap();
    assert!(close(t, 9.0), "{t}");
    l.advance(t);
    l.take_finished(t, &mut done);
    assert_eq!(done, vec![2]);
    assert!(close(rate(&mut l, 1), 10.0));
    let t = l.next_finish().unwrap();
    assert!(close(t, 12.0), "{t}");
    l.advance(t);
    l.take_finished(t, &mut done);
    assert_eq!(done, vec![2, 1]);
    assert_eq!(l.active(), 0);
    // The class is gone and comes back fresh.
    l.start(&[a], 10.0, 3);
    assert!(close(l.next_finish().unwrap(), 13.0));
}

/// Flows that end at one instant are taken together, and time advances the others.
#[test]
fn lockstep_flows_end_together() {
    let mut l = Links::new();
    let links: Vec<LinkId> = (0..4).map(|_| l.add(2.0)).collect();
    for (t, &k) in links.iter().enumerate() {
        l.start(&[k], 3.0, t as u32);
    }
    let t = l.next_finish().unwrap();
    assert!(close(t, 1.5));
    let mut done = Vec::new();
    l.advance(t);
    l.take_finished(t, &mut done);
    done.sort_unstable();
    assert_eq!(done, vec![0, 1, 2, 3]);
    assert_eq!(l.active(), 0);
    assert_eq!(l.next_finish(), None);
}

/// Run the flows to their ends: each token with the instant its flow ended.
fn ends(l: &mut Links) -> Vec<(u32, f64)> {
    let mut all = Vec::new();
    while let Some(t) = l.next_finish() {
        l.advance(t);
        let mut out = Vec::new();
        l.take_finished(t, &mut out);
        all.extend(out.into_iter().map(|k| (k, t)));
    }
    all
}

/// A link of rate 1 with a bucket of 100 bytes at peak 5: a flow of 300 bytes goes at 5 until
/// the bucket runs dry (it drains at 5 - 1 = 4 a microsecond: 25 us, 125 bytes), the other 175
/// at 1: it ends at 200 us. Two flows of 100 share the peak (2.5 each) for those 25 us, then
/// the rate: both end at 100 us.
#[test]
fn a_shaped_link_passes_its_bucket_at_the_peak_then_its_rate() {
    let mut l = Links::new();
    let a = l.add_shaped(1.0, 5.0, 100.0);
    l.start(&[a], 300.0, 1);
    let e = ends(&mut l);
    assert!(e.len() == 1 && close(e[0].1, 200.0), "{e:?}");
    let mut l = Links::new();
    let a = l.add_shaped(1.0, 5.0, 100.0);
    l.start(&[a], 100.0, 1);
    l.start(&[a], 100.0, 2);
    let e = ends(&mut l);
    assert!(e.len() == 2 && e.iter().all(|x| close(x.1, 100.0)), "{e:?}");
}

/// The bucket fills at the rate while the link is idle: 50 bytes at the peak (10 us) leave 60
/// tokens; 90 us idle fill it again (to its 100, not 150), so a flow of 225 bytes started at
/// 100 us goes at the peak for 25 us and ends at 225 us (with the 60 tokens left it would
/// have ended at 265).
#[test]
fn an_idle_shaped_link_refills_its_bucket() {
    let mut l = Links::new();
    let a = l.add_shaped(1.0, 5.0, 100.0);
    l.start(&[a], 50.0, 1);
    let e = ends(&mut l);
    assert!(close(e[0].1, 10.0), "{e:?}");
    l.advance(100.0);
    l.start(&[a], 225.0, 2);
    let e = ends(&mut l);
    assert!(e.len() == 1 && close(e[0].1, 225.0), "{e:?}");
}

/// A flow across a shaped link and a plain one of 2 is held to 2 while the bucket lasts (it
/// drains at 1: 100 us, 200 bytes), then to the rate: 400 bytes end at 300 us.
#[test]
fn a_shaped_link_behind_a_slower_one_drains_at_the_excess() {
    let mut l = Links::new();
    let a = l.add_shaped(1.0, 5.0, 100.0);
    let b = l.add(2.0);
    l.start(&[a, b], 400.0, 1);
    let e = ends(&mut l);
    assert!(e.len() == 1 && close(e[0].1, 300.0), "{e:?}");
}
