//! The transactional outbox against the real Postgres and NATS: only committed messages are
//! published, each once, with its id as `Nats-Msg-Id`, whichever relay takes it; the
//! streams it publishes to, declared on a cluster that cannot place them yet; the
//! tracking hosts' bucket, whose copies miss no change; and the gateway's hits publisher.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use uuid::Uuid;

use postmesh_shared::jetstream::outbox::{self, Outbox, OutboxMessage};
use postmesh_shared::jetstream::Stream;
use postmesh_shared::{db, ApiError, Service};
use postmesh_tests::{peek, remove_namespace, ServiceDb};

/// A database with the kit's tables, the namespace's streams, and a core NATS subscription
/// to the SEND subject.
async fn setup() -> (
    ServiceDb,
    async_nats::Subscriber,
    async_nats::jetstream::Context,
) {
    let store = ServiceDb::create(Service::Domain, &[&db::KIT_MIGRATIONS]).await;
    let nats = postmesh_tests::ops_nats(&store.common.nats_url)
        .await
        .unwrap();
    let js = async_nats::jetstream::new(nats.clone());
    let ns = &store.common.namespace;
    postmesh_shared::jetstream::ensure_streams(&js, ns, 1)
        .await
        .unwrap();
    let sub = nats.subscribe(Stream::Send.subject(ns)).await.unwrap();
    nats.flush().await.unwrap();
    (store, sub, js)
}

/// The operator's connection to the tests' NATS server.
async fn ops() -> async_nats::Client {
    postmesh_tests::ops_nats(&postmesh_tests::nats_url())
        .await
        .unwrap()
}

async fn write(store: &ServiceDb, n: usize, commit: bool) -> Vec<Uuid> {
    let mut tx = store.pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        let id = Uuid::now_v7();
        let msg = OutboxMessage {
            id,
            subject: Stream::Send.subject(&store.common.namespace),
            payload: Bytes::from(format!("message {i}")),
        };
        outbox::enqueue(&mut tx, &msg).await.unwrap();
        ids.push(id);
    }
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    ids
}

/// Message ids seen on the subject (core NATS sees every publish, even ones JetStream then
/// drops as duplicates) until `quiet` passes without one.
async fn seen(sub: &mut async_nats::Subscriber, quiet: Duration) -> Vec<String> {
    let mut ids = Vec::new();
    while let Ok(Some(msg)) = tokio::time::timeout(quiet, sub.next()).await {
        let id = msg.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id"));
        ids.push(id.expect("Nats-Msg-Id").to_string());
    }
    ids
}

async fn waiting(store: &ServiceDb) -> i64 {
    peek::kit::unpublished(&store.pool).await
}

#[tokio::test]
async fn only_committed_messages_are_published_and_a_relay_after_a_crash_sends_them() {
    let (store, mut sub, js) = setup().await;
    let ns = store.common.namespace.clone();
    // Written and committed, then the writer "crashed" before publishing anything.
    let committed = write(&store, 3, true).await;
    let _rolled_back = write(&store, 2, false).await;
    assert_eq!(waiting(&store).await, 3);
    assert!(seen(&mut sub, Duration::from_millis(300)).await.is_empty());
    // A relay started afterwards publishes the committed messages, in order, once.
    let relay = Outbox::new(store.pool.clone(), js.clone());
    assert!(!relay.relay_once().await.unwrap(), "one pass was enough");
    let ids = seen(&mut sub, Duration::from_millis(300)).await;
    let expected: Vec<String> = committed.iter().map(Uuid::to_string).collect();
    assert_eq!(ids, expected);
    assert_eq!(waiting(&store).await, 0);
    relay.relay_once().await.unwrap();
    assert!(seen(&mut sub, Duration::from_millis(300)).await.is_empty());
    let mut stream = js.get_stream(Stream::Send.name(&ns)).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 3);
    remove_namespace(&store.common).await;
}

/// A message larger than NATS carries can never be published: the relay drops it, and the
/// messages after it go out (it stayed first in line, and held up every later one).
#[tokio::test]
async fn a_message_nats_cannot_carry_holds_up_no_other() {
    let (store, mut sub, js) = setup().await;
    let mut tx = store.pool.begin().await.unwrap();
    let huge = OutboxMessage {
        id: Uuid::now_v7(),
        subject: Stream::Send.subject(&store.common.namespace),
        payload: Bytes::from(vec![b'x'; 2 << 20]),
    };
    outbox::enqueue(&mut tx, &huge).await.unwrap();
    tx.commit().await.unwrap();
    let after = write(&store, 2, true).await;
    let relay = Outbox::new(store.pool.clone(), js.clone());
    relay
        .relay_once()
        .await
        .expect("a pass that publishes the others");
    let ids = seen(&mut sub, Duration::from_millis(300)).await;
    let expected: Vec<String> = after.iter().map(Uuid::to_string).collect();
    assert_eq!(ids, expected);
    assert_eq!(waiting(&store).await, 0);
    remove_namespace(&store.common).await;
}

#[tokio::test]
async fn relays_of_several_replicas_publish_each_message_once() {
    let (store, mut sub, js) = setup().await;
    let written = write(&store, 250, true).await;
    let replicas: Vec<_> = (0..3)
        .map(|_| {
            let relay = Outbox::new(store.pool.clone(), js.clone());
            tokio::spawn(async move { while relay.relay_once().await.unwrap() {} })
        })
        .collect();
    for replica in replicas {
        replica.await.unwrap();
    }
    let ids = seen(&mut sub, Duration::from_millis(500)).await;
    assert_eq!(ids.len(), 250, "every message published exactly once");
    let distinct: HashSet<String> = ids.into_iter().collect();
    let expected: HashSet<String> = written.iter().map(Uuid::to_string).collect();
    assert_eq!(distinct, expected);
    remove_namespace(&store.common).await;
}

#[tokio::test]
async fn a_message_published_now_is_not_published_again_and_a_withdrawn_one_never() {
    let (store, mut sub, js) = setup().await;
    let outbox = Outbox::new(store.pool.clone(), js.clone());
    let ids = write(&store, 2, true).await;
    outbox.publish_now(ids[0]).await.unwrap();
    outbox.publish_now(ids[0]).await.unwrap();
    assert!(!outbox.withdraw(ids[0]).await.unwrap(), "already published");
    assert!(outbox.withdraw(ids[1]).await.unwrap());
    outbox.relay_once().await.unwrap();
    let seen = seen(&mut sub, Duration::from_millis(300)).await;
    assert_eq!(seen, vec![ids[0].to_string()]);
    // Without a stream to take it, a publish fails and the message stays waiting.
    js.delete_stream(Stream::Send.name(&store.common.namespace))
        .await
        .unwrap();
    let lost = write(&store, 1, true).await;
    assert!(outbox.publish_now(lost[0]).await.is_err());
    assert!(outbox.relay_once().await.is_err());
    assert_eq!(waiting(&store).await, 1);
    remove_namespace(&store.common).await;
}

/// A duplicate acknowledgement of sequence 0, what a clustered nats-server 2.10 stream leader
/// answers for a message id it recorded and never stored (its proposal died with a leader
/// killed or cut off), is no confirmation: the message stays waiting until an
/// acknowledgement names where it is stored.
#[tokio::test]
async fn a_duplicate_of_sequence_zero_is_not_taken_as_stored() {
    let (store, mut sub, js) = setup().await;
    let nats = postmesh_tests::ops_nats(&store.common.nats_url)
        .await
        .unwrap();
    // Core NATS answers in the stream's place, as its leader would.
    js.delete_stream(Stream::Send.name(&store.common.namespace))
        .await
        .unwrap();
    let outbox = Outbox::new(store.pool.clone(), js.clone());
    let id = write(&store, 1, true).await[0];
    for (seq, stored) in [(0, false), (7, true)] {
        let publishing = tokio::spawn({
            let outbox = outbox.clone();
            async move { outbox.publish_now(id).await }
        });
        let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("the publish")
            .expect("a message");
        let ack = format!(r#"{{"stream":"SEND", "seq":{seq},"duplicate": true}}"#);
        nats.publish(msg.reply.expect("a reply subject"), ack.into())
            .await
            .unwrap();
        let published = publishing.await.unwrap();
        assert_eq!(published.is_ok(), stored, "seq {seq}: {published:?}");
        assert_eq!(waiting(&store).await, i64::from(!stored));
    }
    remove_namespace(&store.common).await;
}

/// The streams a service declares at its start wait for a cluster that cannot place them
/// yet: asked for three replicas while one of three nodes is down, they are made once it is
/// back (a cluster that had just formed answered the soak's services so, and they exited).
#[tokio::test]
async fn streams_wait_until_the_cluster_can_place_them() {
    use async_nats::jetstream::context::CreateStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    use postmesh_tests::cluster::{nats_cluster, try_nats_cluster, ClusterGuard};

    let _cluster = ClusterGuard::start().await;
    // A cluster formed afresh by nodes 1 and 2 alone, which has never seen node 3: each
    // start waits until the running nodes are healthy, which needs the other. (Not node 3
    // stopped: its peers still count it and place replicas on it.) Two fresh nodes under a
    // loaded CI machine once elected no meta leader within 30 s: the formation is NATS's,
    // not ours, so a failed one is made again, twice at most.
    for attempt in 1..=3 {
        nats_cluster(&["clean"]).await;
        let formed = tokio::join!(
            try_nats_cluster(&["start-node", "1"]),
            try_nats_cluster(&["start-node", "2"])
        );
        match formed {
            (Ok(_), Ok(_)) => break,
            (Err(e), _) | (_, Err(e)) if attempt == 3 => panic!("{e}"),
            (Err(e), _) | (_, Err(e)) => eprintln!("formation {attempt} failed: {e}"),
        }
    }
    let nats = postmesh_tests::ops_nats("nats://127.0.0.1:4231,nats://127.0.0.1:4232")
        .await
        .unwrap();
    let js = async_nats::jetstream::new(nats);
    let ns = postmesh_tests::fresh_namespace();
    let refused = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: ns.stream("PROBE"),
            subjects: vec![ns.subject("probe")],
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .expect_err("three replicas on two nodes");
    match refused.kind() {
        CreateStreamErrorKind::JetStream(e) => {
            assert_eq!(e.error_code(), ErrorCode::CLUSTER_NO_PEERS, "{e}")
        }
        other => panic!("not a placement refusal: {other}"),
    }

    let declaring = tokio::spawn({
        let (js, ns) = (js.clone(), ns.clone());
        async move {
            postmesh_shared::jetstream::ensure_streams(&js, &ns, 3).await?;
            postmesh_shared::nats::ensure_bodies(&js, &ns, 3).await
        }
    });
    nats_cluster(&["start-node", "3"]).await;
    declaring
        .await
        .unwrap()
        .expect("the streams, once node 3 is back");
    for stream in Stream::ALL {
        let info = js
            .get_stream(stream.name(&ns))
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .clone();
        assert_eq!(info.config.num_replicas, 3, "{stream:?}");
        js.delete_stream(stream.name(&ns)).await.unwrap();
    }
    js.delete_object_store(postmesh_shared::nats::bodies_bucket(&ns))
        .await
        .unwrap();
}

/// A gateway's copy of the verified tracking hosts misses no change made once it is set up,
/// the very first ones among them: a host let go and another held, by another connection,
/// before this test's runtime has run anything else.
#[tokio::test]
async fn copies_of_the_tracking_hosts_miss_no_change() {
    use postmesh_shared::tracking_hosts::{self, HostsWriter, VerifiedHosts};

    let nats = ops().await;
    let js = async_nats::jetstream::new(nats);
    let ns = postmesh_tests::fresh_namespace();
    let store = tracking_hosts::ensure(&js, &ns, 1).await.unwrap();
    let writer = HostsWriter::new(store.clone());
    let domain = Uuid::now_v7();
    writer.hold("track.gone.example", domain).await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let copy = VerifiedHosts::watch(store.clone(), shutdown.clone())
        .await
        .unwrap();
    assert_eq!(copy.domain("track.gone.example"), Some(domain));
    // Blocking this runtime until done, on a runtime and connection of their own.
    let elsewhere = ns.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let nats = ops().await;
            let js = async_nats::jetstream::new(nats);
            let store = tracking_hosts::ensure(&js, &elsewhere, 1).await.unwrap();
            let writer = HostsWriter::new(store);
            writer.release("track.gone.example", domain).await.unwrap();
            writer.hold("track.held.example", domain).await.unwrap();
        })
    })
    .join()
    .unwrap();
    // A change after the others: once the copy has it, it has had every earlier one.
    writer.hold("track.last.example", domain).await.unwrap();
    postmesh_tests::eventually(Duration::from_secs(10), || async {
        copy.domain("track.last.example").ok_or("not yet")
    })
    .await;
    assert_eq!(copy.domain("track.gone.example"), None);
    assert_eq!(copy.domain("track.held.example"), Some(domain));
    shutdown.cancel();
    js.delete_key_value(tracking_hosts::bucket(&ns))
        .await
        .unwrap();
}

/// A release takes back only its own domain's hold: a late release of a removed domain
/// leaves the host to the domain that holds it now.
#[tokio::test]
async fn a_tracking_host_is_released_only_by_the_domain_holding_it() {
    use postmesh_shared::tracking_hosts::{self, HostsWriter};

    let js = async_nats::jetstream::new(ops().await);
    let ns = postmesh_tests::fresh_namespace();
    let store = tracking_hosts::ensure(&js, &ns, 1).await.unwrap();
    let writer = HostsWriter::new(store.clone());
    let (before, now) = (Uuid::now_v7(), Uuid::now_v7());
    writer.hold("track.again.example", now).await.unwrap();
    writer.release("track.again.example", before).await.unwrap();
    let held = store.get("track.again.example").await.unwrap();
    assert_eq!(held.as_deref(), Some(now.as_bytes().as_slice()));
    writer.release("track.again.example", now).await.unwrap();
    assert_eq!(store.get("track.again.example").await.unwrap(), None);
    // Released already: nothing to do, no error.
    writer.release("track.again.example", now).await.unwrap();
    js.delete_key_value(tracking_hosts::bucket(&ns))
        .await
        .unwrap();
}

/// The gateway's hits publisher: a hit JetStream has not stored within its deadline is a
/// 503, and one answered so while it waited is left out of the next message.
#[tokio::test]
async fn tracking_hits_not_stored_in_time_are_refused_and_left_out() {
    use postmesh_shared::proto::{TrackingHit, TrackingHits};
    use prost::Message as _;

    let nats = ops().await;
    let ns = postmesh_tests::fresh_namespace();
    // No stream: the hits reach a subscriber that acknowledges only when told.
    let mut stream = nats.subscribe(Stream::Tracking.subject(&ns)).await.unwrap();
    nats.flush().await.unwrap();
    let js = async_nats::jetstream::new(nats.clone());
    let hits = api_gateway::tracking::Hits::start(js, &ns, Duration::from_millis(300));
    let hit = |url: &str| TrackingHit {
        url: url.into(),
        ..Default::default()
    };
    let first = tokio::spawn({
        let (hits, hit) = (hits.clone(), hit("first"));
        async move { hits.publish(hit).await }
    });
    let in_flight = stream.next().await.unwrap();
    // The next hit waits behind the first's message: past its deadline, a 503.
    let second = tokio::time::timeout(Duration::from_secs(5), hits.publish(hit("second")))
        .await
        .expect("answered within its deadline");
    assert!(
        matches!(second, Err(ApiError::Unavailable(_))),
        "{second:?}"
    );
    assert!(matches!(
        first.await.unwrap(),
        Err(ApiError::Unavailable(_))
    ));
    // The first's message stored at last: the next one carries the hits waiting now, and
    // not the one already answered.
    let ack = br#"{"stream":"TRACKING","seq":1}"#;
    nats.publish(in_flight.reply.unwrap(), ack[..].into())
        .await
        .unwrap();
    let _third = tokio::spawn({
        let (hits, hit) = (hits.clone(), hit("third"));
        async move { hits.publish(hit).await }
    });
    let next = TrackingHits::decode(stream.next().await.unwrap().payload).unwrap();
    let urls: Vec<&str> = next.hits.iter().map(|h| h.url.as_str()).collect();
    assert_eq!(urls, ["third"]);
}
