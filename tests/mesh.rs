//! The mesh end to end: three (or four) `kvgate` processes on loopback in front of one
//! `sim-engine` fleet, joined with `--enable-mesh`. A prefix one gateway learned routes to the
//! same worker from the others; a gateway that joins late catches up by repair; a killed gateway
//! is declared down and the rest keep sharing (a repair asked of it moves to another peer); a
//! restarted one rejoins; a paused one (SIGSTOP) rejoins after SIGCONT; a
//! flood of deltas leaves memory bounded; a newer message version is read. Every gateway holds
//! the same `--mesh-secret-file`; the attacks of issue 37 (no key, a wrong key, a key holder
//! that is not a member, a foreign sender, unsolicited repair pages, partial and huge frames,
//! idle connections, fake models) are refused, counted, and leave routing and memory as they
//! were; `--enable-mesh` without a dialable address refuses to start.

mod utils;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kvgate::mesh::auth::{self, Authenticator, MeshKey, StreamSeal, CHALLENGE_BYTES};
use kvgate::mesh::wire::{self, frame::Body, Delta, DeltaBatch, Frame, RepairPage, RepairRequest};
use utils::process::{free_port, workspace_bin, ChildProcess, Gateway, SimFleet};
use utils::wait_until;

/// Long enough for SWIM to suspect and declare a peer down (LAN settings: about 10 s) with room.
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(40);

struct Mesh {
    fleet: SimFleet,
    gateways: Vec<Gateway>,
    mesh_ports: Vec<u16>,
}

/// The key every gateway of these tests shares.
const SECRET: &str = "kvgate-tests-mesh-shared-secret-0123456789";

/// The file holding [`SECRET`], written once per test binary.
fn secret_file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("kvgate-mesh-secret-{}", std::process::id()));
        std::fs::write(&path, format!("{SECRET}\n")).expect("write the secret file");
        path
    })
}

fn authenticator(secret: Option<&str>) -> Authenticator {
    let key = secret.map(|s| MeshKey::new(s.as_bytes()).expect("a long enough key"));
    Authenticator::new(key.as_ref())
}

/// A stream to a gateway's mesh port, past its challenge, sealing under `secret` (`None`: the
/// public key of an unauthenticated mesh).
struct FakePeer {
    stream: TcpStream,
    seal: StreamSeal,
}

impl FakePeer {
    fn dial(port: u16, secret: Option<&str>) -> FakePeer {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("mesh port");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut challenge = [0u8; CHALLENGE_BYTES];
        stream.read_exact(&mut challenge).expect("a challenge");
        let nonce = auth::parse_challenge(&challenge).expect("a kvgate challenge");
        let auth = authenticator(secret);
        stream.write_all(&auth.proof(&nonce)).expect("proof");
        FakePeer {
            stream,
            seal: StreamSeal::new(auth, nonce),
        }
    }

    fn send(&mut self, frame: &Frame) -> std::io::Result<()> {
        let sealed = self.seal.seal(&wire::encode(frame));
        self.stream.write_all(&sealed)
    }
}

fn mesh_args(port: u16, peers: &[u16]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--enable-mesh",
        "--mesh-host",
        "127.0.0.1",
        "--mesh-port",
        &port.to_string(),
        "--mesh-server-name",
        &format!("gw-{port}"),
        "--mesh-secret-file",
        secret_file().to_str().expect("a UTF-8 temp path"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !peers.is_empty() {
        args.push("--mesh-peer-urls".into());
        args.extend(peers.iter().map(|p| format!("127.0.0.1:{p}")));
    }
    args
}

fn start_gateway(fleet: &SimFleet, port: u16, peers: &[u16]) -> Gateway {
    let args = mesh_args(port, peers);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Gateway::start(&fleet.urls(), &args)
}

impl Mesh {
    /// `n` gateways; each after the first announces itself to the first only.
    fn start(n: usize) -> Mesh {
        let fleet = SimFleet::start(4, &["--instant"]);
        let mesh_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let gateways = (0..n)
            .map(|i| {
                let peers = if i == 0 { &[][..] } else { &mesh_ports[..1] };
                start_gateway(&fleet, mesh_ports[i], peers)
            })
            .collect();
        let mesh = Mesh {
            fleet,
            gateways,
            mesh_ports,
        };
        for (i, gateway) in mesh.gateways.iter().enumerate() {
            assert!(
                wait_until(MEMBERSHIP_WAIT, || alive(gateway) == n as f64 - 1.0),
                "gateway {i} sees {} alive peers of {}",
                alive(gateway),
                n - 1
            );
        }
        mesh
    }
}

fn alive(gateway: &Gateway) -> f64 {
    gateway.metric("kvgate_mesh_peers{state=\"alive\"}")
}

fn down(gateway: &Gateway) -> f64 {
    gateway.metric("kvgate_mesh_peers{state=\"down\"}")
}

fn applied(gateway: &Gateway) -> f64 {
    gateway.metric("kvgate_mesh_inserts_applied_total")
}

/// A `/generate` body whose 128 token ids are `family`'s own.
fn generate(family: u32) -> String {
    let ids: Vec<u32> = (0..128).map(|i| family * 1000 + i).collect();
    serde_json::json!({
        "model": "sim-model",
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1},
    })
    .to_string()
}

fn route(gateway: &Gateway, family: u32) -> String {
    let response = gateway.client().post_json("/generate", &generate(family));
    assert_eq!(response.status, 200, "{}", response.text());
    let worker = response.routed_worker().expect("routed worker header");
    worker.to_string()
}

/// Sends each family once to `gateway`; returns the worker each went to.
fn teach(gateway: &Gateway, families: std::ops::Range<u32>) -> HashMap<u32, String> {
    families.map(|f| (f, route(gateway, f))).collect()
}

/// Waits until `gateway` received at least `n` deltas, applied at least `n` peer inserts, and
/// runs no repair.
fn wait_applied(gateway: &Gateway, n: f64) {
    wait_settled(gateway, n, n);
}

/// As [`wait_applied`], with `received` deltas and `n` inserts.
fn wait_settled(gateway: &Gateway, received: f64, n: f64) {
    let settled = || {
        let repairs = |outcome: &str| {
            gateway.metric(&format!(
                "kvgate_mesh_repairs_total{{outcome=\"{outcome}\"}}"
            ))
        };
        let idle = repairs("started") == repairs("completed") + repairs("abandoned");
        let heard = gateway.metric("kvgate_mesh_deltas_total{outcome=\"received\"}");
        idle && heard >= received && applied(gateway) >= n
    };
    assert!(
        wait_until(MEMBERSHIP_WAIT, settled),
        "peer inserts applied: {} of {n}; metrics:\n{}",
        applied(gateway),
        mesh_metrics(gateway)
    );
}

fn mesh_metrics(gateway: &Gateway) -> String {
    let metrics = gateway.metrics();
    let lines = metrics.lines().filter(|l| l.starts_with("kvgate_mesh"));
    lines.collect::<Vec<_>>().join("\n")
}

fn assert_routes_like(gateway: &Gateway, taught: &HashMap<u32, String>, who: &str) {
    for (&family, worker) in taught {
        assert_eq!(&route(gateway, family), worker, "{who}: family {family}");
    }
}

#[test]
fn a_prefix_learned_on_one_gateway_routes_to_the_same_worker_from_the_others() {
    let mesh = Mesh::start(3);
    let (a, b, c) = (&mesh.gateways[0], &mesh.gateways[1], &mesh.gateways[2]);
    let taught = teach(a, 0..8);
    let spread: std::collections::HashSet<&String> = taught.values().collect();
    assert!(
        spread.len() > 1,
        "the families spread over workers: {taught:?}"
    );
    for (gateway, who) in [(b, "b"), (c, "c")] {
        wait_applied(gateway, 8.0);
        assert_routes_like(gateway, &taught, who);
    }
    assert!(a.metric("kvgate_mesh_deltas_total{outcome=\"sent\"}") >= 16.0);
    assert!(b.metric("kvgate_mesh_deltas_total{outcome=\"received\"}") >= 8.0);
    assert!(a.metric("kvgate_mesh_sync_round_duration_seconds_count") > 0.0);
    // B's dispatches of A's families were B's own decisions: they go to A and C as deltas.
    let sent = || b.metric("kvgate_mesh_deltas_total{outcome=\"sent\"}");
    assert!(
        wait_until(MEMBERSHIP_WAIT, || sent() >= 16.0),
        "b sent {}",
        sent()
    );
}

/// A chat body (text: the sim model has no tokenizer) of `family`'s 3 KB system prompt and
/// `question`. The prompt holds a marker the mesh must never carry.
fn chat(family: u32, question: &str) -> String {
    let rules: Vec<String> = (0..120)
        .map(|i| format!("family {family} rule {i}: answer briefly"))
        .collect();
    serde_json::json!({
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": rules.join("; ")},
            {"role": "user", "content": question}
        ],
        "max_tokens": 1,
    })
    .to_string()
}

fn route_chat(gateway: &Gateway, family: u32, question: &str) -> String {
    let response = gateway
        .client()
        .post_json("/v1/chat/completions", &chat(family, question));
    assert_eq!(response.status, 200, "{}", response.text());
    let worker = response.routed_worker().expect("routed worker header");
    worker.to_string()
}

/// Issue 37's text sync: B never saw the families' text, yet routes their next chats where A
/// placed them, from the hashes of the text's pages A shared.
#[test]
fn a_text_prompt_taught_through_one_gateway_routes_to_the_same_worker_through_another() {
    let mesh = Mesh::start(2);
    let (a, b) = (&mesh.gateways[0], &mesh.gateways[1]);
    let taught: HashMap<u32, String> = (0..8)
        .map(|f| (f, route_chat(a, f, "what is the first rule?")))
        .collect();
    let spread: std::collections::HashSet<&String> = taught.values().collect();
    assert!(
        spread.len() > 1,
        "the families spread over workers: {taught:?}"
    );
    // Applied without a repair (the deltas carry the pages); on the binary before this change
    // B applied none (a text delta named a path it did not know, and repairs carry no text).
    wait_applied(b, 8.0);
    assert!(a.metric("kvgate_mesh_sent_pages_total") >= 8.0 * 40.0);
    // In another order than A's: B's own placements of new prefixes cannot repeat A's.
    for family in (0..8).rev() {
        let routed = route_chat(b, family, "and the second one?");
        assert_eq!(routed, taught[&family], "b: family {family}");
    }
}

#[test]
fn a_gateway_that_joins_late_catches_up_by_repair() {
    let mut mesh = Mesh::start(2);
    let taught = teach(&mesh.gateways[0], 0..20);
    wait_applied(&mesh.gateways[1], 20.0);
    // D joins through B, after A learned the families.
    let port = free_port();
    mesh.mesh_ports.push(port);
    let late = start_gateway(&mesh.fleet, port, &mesh.mesh_ports[1..2]);
    // Every gateway knows every other (A learns of D from B's gossip).
    for gateway in mesh.gateways.iter().chain([&late]) {
        assert!(wait_until(MEMBERSHIP_WAIT, || alive(gateway) == 2.0));
    }
    // One new prefix on A: its delta names a path D does not know, and D repairs.
    let more = teach(&mesh.gateways[0], 100..101);
    wait_settled(&late, 1.0, 21.0);
    assert!(late.metric("kvgate_mesh_repairs_total{outcome=\"completed\"}") >= 1.0);
    assert_routes_like(&late, &taught, "late gateway");
    assert_routes_like(&late, &more, "late gateway");
}

#[test]
fn a_killed_gateway_is_declared_down_and_the_others_keep_sharing() {
    let mut mesh = Mesh::start(3);
    mesh.gateways[2].process.kill();
    for gateway in &mesh.gateways[..2] {
        assert!(
            wait_until(MEMBERSHIP_WAIT, || alive(gateway) == 1.0
                && down(gateway) >= 1.0),
            "{}",
            mesh_metrics(gateway)
        );
    }
    let taught = teach(&mesh.gateways[0], 0..6);
    wait_applied(&mesh.gateways[1], 6.0);
    assert_routes_like(&mesh.gateways[1], &taught, "b");
}

#[test]
fn a_repair_asked_of_a_killed_gateway_moves_to_another_peer() {
    let mut mesh = Mesh::start(3);
    let taught = teach(&mesh.gateways[0], 0..6);
    for gateway in &mesh.gateways[1..] {
        wait_applied(gateway, 6.0);
    }
    // D joins through B after the families were learned.
    let port = free_port();
    let late = start_gateway(&mesh.fleet, port, &mesh.mesh_ports[1..2]);
    for gateway in mesh.gateways.iter().chain([&late]) {
        assert!(wait_until(MEMBERSHIP_WAIT, || alive(gateway) == 3.0));
    }
    // A dies; before SWIM notices, D hears a delta of an unknown path said to come from A, so
    // its repair asks A first, stalls, and moves on.
    mesh.gateways[0].process.kill();
    let batch = DeltaBatch {
        model: kvgate::policy::model_hash("sim-model"),
        recipients: 0,
        epoch: 0,
        known_before: 0,
        worker_urls: vec![mesh.fleet.url(0)],
        deltas: vec![Delta {
            kind: wire::TreeKind::Token as i32,
            path_hash: 0x5eed,
            worker: 0,
            ..Delta::default()
        }],
    };
    let a = format!("127.0.0.1:{}", mesh.mesh_ports[0]);
    let frame = wire::frame(&a, Body::Deltas(batch));
    FakePeer::dial(port, Some(SECRET))
        .send(&frame)
        .expect("write");
    let repairs = |outcome: &str| {
        late.metric(&format!(
            "kvgate_mesh_repairs_total{{outcome=\"{outcome}\"}}"
        ))
    };
    assert!(
        wait_until(MEMBERSHIP_WAIT, || repairs("completed") >= 1.0),
        "{}",
        mesh_metrics(&late)
    );
    assert!(repairs("retried") >= 1.0, "{}", mesh_metrics(&late));
    assert_eq!(repairs("abandoned"), 0.0);
    // A completed repair is on the mesh thread; its inserts reach the index when the control
    // core drains them.
    wait_settled(&late, 1.0, 6.0);
    assert_routes_like(&late, &taught, "late gateway");
}

#[test]
fn a_restarted_gateway_rejoins_and_learns_again() {
    let mut mesh = Mesh::start(3);
    // A's stream to C is connected before C is killed.
    teach(&mesh.gateways[0], 100..101);
    wait_applied(&mesh.gateways[2], 1.0);
    mesh.gateways[2].process.kill();
    let a = &mesh.gateways[0];
    assert!(
        wait_until(MEMBERSHIP_WAIT, || alive(a) == 1.0),
        "{}",
        mesh_metrics(a)
    );
    // The same address again, a newer incarnation: it wins the address and rejoins.
    let port = mesh.mesh_ports[2];
    let restarted = start_gateway(&mesh.fleet, port, &mesh.mesh_ports[..1]);
    for gateway in mesh.gateways[..2].iter().chain([&restarted]) {
        assert!(
            wait_until(MEMBERSHIP_WAIT, || alive(gateway) == 2.0),
            "{}",
            mesh_metrics(gateway)
        );
    }
    // One delta first: A's stream to the killed process must not swallow it (it is what
    // starts the restarted gateway's catch-up).
    let first = teach(a, 0..1);
    wait_applied(&restarted, 1.0);
    let taught = teach(a, 1..6);
    wait_applied(&restarted, 6.0);
    assert_routes_like(&restarted, &first, "restarted gateway");
    assert_routes_like(&restarted, &taught, "restarted gateway");
}

#[test]
fn a_paused_gateway_rejoins_after_sigcont() {
    let mesh = Mesh::start(3);
    let c = &mesh.gateways[2];
    let a = &mesh.gateways[0];
    // C has heard from A before the pause (its catch-up on first hearing is spent).
    teach(a, 100..101);
    wait_applied(c, 1.0);
    c.process.signal(libc::SIGSTOP);
    assert!(
        wait_until(MEMBERSHIP_WAIT, || down(a) == 1.0),
        "{}",
        mesh_metrics(a)
    );
    // What A learns while C is away reaches C by its catch-up once it is back (C was declared
    // down, so A sent it nothing meanwhile).
    let missed = teach(a, 50..56);
    c.process.signal(libc::SIGCONT);
    for gateway in &mesh.gateways {
        assert!(
            wait_until(MEMBERSHIP_WAIT, || alive(gateway) == 2.0),
            "{}",
            mesh_metrics(gateway)
        );
    }
    let taught = teach(a, 0..6);
    // 7 deltas, and 13 inserts: the 6 missed ones came by the catch-up repair.
    wait_settled(c, 7.0, 13.0);
    assert_routes_like(c, &taught, "resumed c");
    assert_routes_like(c, &missed, "resumed c, what it missed");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kib = line.split_whitespace().nth(1).expect("a value");
    kib.parse().expect("a number")
}

#[test]
fn a_flood_of_deltas_leaves_memory_bounded_and_newer_frames_are_read() {
    let mesh = Mesh::start(2);
    let a = &mesh.gateways[0];
    let taught = teach(a, 0..2);
    let before = rss_kib(a.process.pid());
    // A key holder speaking as member B, about the model A serves.
    let mut peer = FakePeer::dial(mesh.mesh_ports[0], Some(SECRET));
    let b = format!("127.0.0.1:{}", mesh.mesh_ports[1]);
    let frames = 200;
    let per_frame = 10_000u64;
    for f in 0..frames {
        let batch = DeltaBatch {
            model: kvgate::policy::model_hash("sim-model"),
            recipients: 0,
            epoch: 0,
            known_before: 0,
            worker_urls: vec![mesh.fleet.url(0)],
            deltas: (0..per_frame)
                .map(|i| Delta {
                    kind: wire::TreeKind::Token as i32,
                    path_hash: f * per_frame + i + 1,
                    worker: 0,
                    ..Delta::default()
                })
                .collect(),
        };
        let mut frame = wire::frame(&b, Body::Deltas(batch));
        // A newer sender's version number: read all the same.
        frame.version = wire::WIRE_VERSION + 1;
        peer.send(&frame).expect("write");
    }
    let total = (frames * per_frame) as f64;
    assert!(wait_until(MEMBERSHIP_WAIT, || {
        a.metric("kvgate_mesh_deltas_total{outcome=\"received\"}") >= total
    }));
    let after = rss_kib(a.process.pid());
    // Two million unknown paths cost nothing to keep: they are not kept.
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    // A garbage frame (its tag checks) closes that stream and is counted; the gateway still
    // routes as it did.
    let garbage = peer.seal.seal(&[0xff, 0xff, 0xff]);
    peer.stream.write_all(&garbage).expect("write");
    assert!(wait_until(MEMBERSHIP_WAIT, || {
        a.metric("kvgate_mesh_frames_malformed_total") >= 1.0
    }));
    assert_routes_like(a, &taught, "a");
}

fn refused(gateway: &Gateway, reason: &str) -> f64 {
    gateway.metric(&format!("kvgate_mesh_refused_total{{reason=\"{reason}\"}}"))
}

fn wait_refused(gateway: &Gateway, reason: &str, n: f64) {
    assert!(
        wait_until(MEMBERSHIP_WAIT, || refused(gateway, reason) >= n),
        "refused {reason}: {} of {n}; metrics:\n{}",
        refused(gateway, reason),
        mesh_metrics(gateway)
    );
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[test]
fn peers_without_the_key_are_refused_on_tcp_and_udp_and_change_nothing() {
    let mesh = Mesh::start(2);
    let (a, b) = (&mesh.gateways[0], &mesh.gateways[1]);
    assert_eq!(a.metric("kvgate_mesh_authenticated"), 1.0);
    let taught = teach(a, 0..4);
    wait_applied(b, 4.0);
    let applied_before = applied(a);
    let port = mesh.mesh_ports[0];
    let member_b = format!("127.0.0.1:{}", mesh.mesh_ports[1]);
    let delta = || {
        let batch = DeltaBatch {
            model: kvgate::policy::model_hash("sim-model"),
            recipients: 0,
            epoch: 0,
            known_before: 0,
            worker_urls: vec![mesh.fleet.url(3)],
            deltas: vec![Delta {
                kind: wire::TreeKind::Token as i32,
                path_hash: 1,
                worker: 0,
                ..Delta::default()
            }],
        };
        wire::frame(&member_b, Body::Deltas(batch))
    };
    // No key (an unauthenticated mesh's public key), then a wrong one: the proof fails, the
    // stream is closed before a frame is read.
    for secret in [None, Some("kvgate-tests-mesh-the-wrong-secret")] {
        let mut peer = FakePeer::dial(port, secret);
        let _ = peer.send(&delta());
    }
    // The framing before authentication: a length and a frame, no handshake.
    let mut old = TcpStream::connect(("127.0.0.1", port)).expect("mesh port");
    let body = wire::encode(&delta());
    let _ = old.write_all(&[(body.len() as u32).to_be_bytes().to_vec(), body.clone()].concat());
    // But the trailing 32 bytes of a frame of more than 32 may not have arrived: pad it.
    let _ = old.write_all(&[0u8; 32]);
    wait_refused(a, "unauthenticated", 3.0);
    // SWIM datagrams: raw (as foca sends them), under a wrong key, and a right one replayed
    // after its window.
    let udp = UdpSocket::bind("127.0.0.1:0").expect("udp");
    let wrong = authenticator(Some("kvgate-tests-mesh-the-wrong-secret"));
    let stale = authenticator(Some(SECRET)).seal_datagram(b"swim", now_ms() - 60_000);
    for datagram in [
        b"swim".to_vec(),
        wrong.seal_datagram(b"swim", now_ms()),
        stale,
    ] {
        udp.send_to(&datagram, ("127.0.0.1", port)).expect("send");
    }
    wait_refused(a, "unauthenticated", 5.0);
    wait_refused(a, "stale", 1.0);
    assert_eq!(alive(a), 1.0, "{}", mesh_metrics(a));
    assert_eq!(applied(a), applied_before, "nothing of theirs was applied");
    assert_eq!(
        a.metric("kvgate_mesh_deltas_total{outcome=\"received\"}"),
        0.0
    );
    assert_routes_like(a, &taught, "a");
    // The mesh still works for its members.
    let more = teach(b, 10..12);
    wait_settled(a, 2.0, applied_before + 2.0);
    assert_routes_like(a, &more, "a");
}

#[test]
fn a_key_holder_is_heard_only_as_a_member_about_served_models_and_repairs_asked_for() {
    let mesh = Mesh::start(2);
    let (a, b) = (&mesh.gateways[0], &mesh.gateways[1]);
    let taught = teach(a, 0..4);
    wait_applied(b, 4.0);
    let port = mesh.mesh_ports[0];
    let model = kvgate::policy::model_hash("sim-model");
    let member_b = format!("127.0.0.1:{}", mesh.mesh_ports[1]);
    // Not a member: its repair request names an address of its own, which is never dialed.
    let trap = TcpListener::bind("127.0.0.1:0").expect("listener");
    trap.set_nonblocking(true).expect("nonblocking");
    let outsider = trap.local_addr().expect("addr").to_string();
    let mut peer = FakePeer::dial(port, Some(SECRET));
    let request = RepairRequest {
        model,
        repair_id: 1,
        after: 0,
        epoch: 0,
        ..RepairRequest::default()
    };
    peer.send(&wire::frame(
        &outsider,
        Body::RepairRequest(request.clone()),
    ))
    .expect("write");
    wait_refused(a, "not_member", 1.0);
    // A repair page A never asked for, said to come from member B, naming worker 3.
    let page = RepairPage {
        model,
        repair_id: 1,
        worker_urls: vec![mesh.fleet.url(3)],
        entries: Vec::new(),
        next_after: 1,
        done: true,
        epoch: 1,
    };
    let mut peer = FakePeer::dial(port, Some(SECRET));
    peer.send(&wire::frame(&member_b, Body::RepairPage(page)))
        .expect("write");
    wait_refused(a, "unsolicited_repair", 1.0);
    // The same stream then names another sender: closed.
    let _ = peer.send(&wire::frame(&outsider, Body::RepairRequest(request)));
    wait_refused(a, "foreign_sender", 1.0);
    // Many fake models, as member B: refused, nothing kept.
    let before = rss_kib(a.process.pid());
    let mut peer = FakePeer::dial(port, Some(SECRET));
    let fakes = 6_000u64;
    for fake in 0..fakes {
        let batch = DeltaBatch {
            model: fake,
            recipients: 0,
            epoch: 0,
            known_before: 0,
            worker_urls: vec![mesh.fleet.url(3)],
            deltas: (0..64)
                .map(|i| Delta {
                    kind: wire::TreeKind::Token as i32,
                    path_hash: i + 1,
                    worker: 0,
                    ..Delta::default()
                })
                .collect(),
        };
        peer.send(&wire::frame(&member_b, Body::Deltas(batch)))
            .expect("write");
    }
    wait_refused(a, "unknown_model", fakes as f64);
    let after = rss_kib(a.process.pid());
    assert!(
        after < before + 16 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert_eq!(
        a.metric("kvgate_mesh_repairs_total{outcome=\"started\"}"),
        0.0
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        trap.accept().is_err(),
        "the gateway dialed an address named in a frame"
    );
    assert_routes_like(a, &taught, "a");
}

#[test]
fn partial_huge_and_idle_connections_are_cut_off_and_capped() {
    let mesh = Mesh::start(2);
    let (a, b) = (&mesh.gateways[0], &mesh.gateways[1]);
    let port = mesh.mesh_ports[0];
    let before = rss_kib(a.process.pid());
    // A length over the cap: refused from its four bytes.
    let mut peer = FakePeer::dial(port, Some(SECRET));
    peer.stream
        .write_all(&u32::MAX.to_be_bytes())
        .expect("write");
    wait_refused(a, "too_large", 1.0);
    // A frame begun and never finished, and a connection that never proves the key: cut off
    // at their deadlines.
    let mut partial = FakePeer::dial(port, Some(SECRET));
    partial
        .stream
        .write_all(&[0, 0x10, 0, 0, 1, 2, 3])
        .expect("write");
    let silent = TcpStream::connect(("127.0.0.1", port)).expect("mesh port");
    wait_refused(a, "timeout", 2.0);
    // Past the cap of inbound connections, more are closed at accept.
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    wait_refused(a, "streams_full", 100.0);
    let after = rss_kib(a.process.pid());
    assert!(
        after < before + 32 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    drop((idle, silent, partial, peer));
    // Once they are gone (their handshakes time out), members are heard again.
    let taught = teach(b, 0..3);
    wait_applied(a, 3.0);
    assert_routes_like(a, &taught, "a");
}

#[test]
fn enable_mesh_without_an_address_peers_can_dial_refuses_to_start() {
    let log = std::env::temp_dir().join(format!("kvgate-mesh-refuse-{}", std::process::id()));
    let file = std::fs::File::create(&log).expect("log file");
    let mut command = Command::new(workspace_bin("kvgate"));
    command.args([
        "--host",
        "127.0.0.1",
        "--port",
        &free_port().to_string(),
        "--worker-urls",
        "http://127.0.0.1:9",
        "--enable-mesh",
        "--mesh-port",
        &free_port().to_string(),
    ]);
    let mut process = ChildProcess::spawn_with_stderr("kvgate", &mut command, file.into());
    let status = process
        .wait_exit(Duration::from_secs(20))
        .expect("kvgate exits");
    assert!(!status.success());
    let stderr = std::fs::read_to_string(&log).expect("stderr");
    let _ = std::fs::remove_file(&log);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("Error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("--mesh-advertise-host"), "{stderr}");
}
