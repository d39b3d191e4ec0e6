//! A local authoritative DNS server (UDP) whose zones the test sets: the domain service's
//! resolver asks it through `DNS_NAMESERVERS`. It answers like an authoritative server:
//! REFUSED outside its zones, NXDOMAIN for a name with no records, an empty NOERROR for a
//! name without records of the asked type, a name's CNAME to a query of any type, FORMERR
//! for a malformed query.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, CNAME, MX, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// Records by lower-cased name without the final dot.
#[derive(Default)]
struct Zones {
    apexes: HashSet<String>,
    records: HashMap<String, Vec<RData>>,
    queries: usize,
    /// How long each answer takes.
    delay: std::time::Duration,
}

impl Zones {
    fn serves(&self, name: &str) -> bool {
        self.apexes
            .iter()
            .any(|apex| name == apex || name.ends_with(&format!(".{apex}")))
    }
}

/// The fake server. Cloning shares it.
#[derive(Clone)]
pub struct FakeDns {
    /// Where it listens: the value of `DNS_NAMESERVERS`.
    pub addr: SocketAddr,
    zones: Arc<Mutex<Zones>>,
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl FakeDns {
    /// Starts the server on a free local UDP port.
    pub async fn start() -> Self {
        let socket = tokio::net::UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("fake dns binds");
        let addr = socket.local_addr().expect("address");
        let zones = Arc::new(Mutex::new(Zones::default()));
        let served = zones.clone();
        let socket = Arc::new(socket);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                let Some(reply) = answer(&served, &buf[..n]) else {
                    continue;
                };
                let delay = served.lock().unwrap().delay;
                let socket = socket.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = socket.send_to(&reply, peer).await;
                });
            }
        });
        Self { addr, zones }
    }

    /// Makes the server authoritative for `apex` (and everything under it).
    pub fn zone(&self, apex: &str) {
        self.zones.lock().unwrap().apexes.insert(key(apex));
    }

    /// Makes each answer wait `delay` before it is sent, as a slow name server would.
    pub fn set_delay(&self, delay: std::time::Duration) {
        self.zones.lock().unwrap().delay = delay;
    }

    fn set(&self, name: &str, kind: RecordType, data: Vec<RData>) {
        let mut zones = self.zones.lock().unwrap();
        let name = key(name);
        assert!(zones.serves(&name), "{name} is outside the fake's zones");
        let records = zones.records.entry(name.clone()).or_default();
        assert!(
            kind == RecordType::CNAME
                || data.is_empty()
                || records.iter().all(|r| r.record_type() != RecordType::CNAME),
            "{name} is a CNAME: no other record may sit beside it"
        );
        records.retain(|r| r.record_type() != kind);
        records.extend(data);
    }

    /// Sets the MX records of `name` (preference, host); empty removes them.
    pub fn set_mx(&self, name: &str, mx: &[(u16, &str)]) {
        let data = mx
            .iter()
            .map(|(pref, host)| {
                RData::MX(MX::new(
                    *pref,
                    Name::from_ascii(format!("{}.", key(host))).expect("host name"),
                ))
            })
            .collect();
        self.set(name, RecordType::MX, data);
    }

    /// Sets the TXT records of `name`, one each; a value over 255 bytes is split into
    /// character-strings of 255, as a zone file holds it; empty removes them.
    pub fn set_txt(&self, name: &str, values: &[&str]) {
        let data = values
            .iter()
            .map(|v| {
                let strings = v.as_bytes().chunks(255);
                let strings = strings.map(|s| String::from_utf8(s.to_vec()).expect("ASCII"));
                RData::TXT(TXT::new(strings.collect()))
            })
            .collect();
        self.set(name, RecordType::TXT, data);
    }

    /// Sets the A records of `name`; empty removes them.
    pub fn set_a(&self, name: &str, addrs: &[Ipv4Addr]) {
        let data = addrs.iter().map(|ip| RData::A(A(*ip))).collect();
        self.set(name, RecordType::A, data);
    }

    /// Makes `name` a CNAME of `target` (a name with a CNAME holds nothing else, as in real
    /// DNS); none removes it.
    pub fn set_cname(&self, name: &str, target: Option<&str>) {
        let data = target
            .map(|t| {
                RData::CNAME(CNAME(
                    Name::from_ascii(format!("{}.", key(t))).expect("a name"),
                ))
            })
            .into_iter()
            .collect::<Vec<_>>();
        if !data.is_empty() {
            let zones = self.zones.lock().unwrap();
            let others = zones.records.get(&key(name)).into_iter().flatten();
            assert!(
                others
                    .filter(|r| r.record_type() != RecordType::CNAME)
                    .count()
                    == 0,
                "{name} holds other records: no CNAME may sit beside them"
            );
        }
        self.set(name, RecordType::CNAME, data);
    }

    /// How many queries it has answered.
    pub fn queries(&self) -> usize {
        self.zones.lock().unwrap().queries
    }
}

/// The reply to one datagram; none for something that is not even a DNS header.
fn answer(zones: &Mutex<Zones>, datagram: &[u8]) -> Option<Vec<u8>> {
    let query = match Message::from_vec(datagram) {
        Ok(q) => q,
        Err(_) if datagram.len() >= 2 => {
            let id = u16::from_be_bytes([datagram[0], datagram[1]]);
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                .to_vec()
                .ok();
        }
        Err(_) => return None,
    };
    let id = query.metadata.id;
    if query.metadata.message_type != MessageType::Query
        || query.metadata.op_code != OpCode::Query
        || query.queries.len() != 1
    {
        return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
            .to_vec()
            .ok();
    }
    let question = query.queries[0].clone();
    let name = key(&question.name().to_ascii());
    let mut zones = zones.lock().unwrap();
    zones.queries += 1;
    let mut reply = Message::response(id, OpCode::Query);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.add_query(question.clone());
    if !zones.serves(&name) {
        reply.metadata.response_code = ResponseCode::Refused;
        return reply.to_vec().ok();
    }
    reply.metadata.authoritative = true;
    match zones.records.get(&name).filter(|r| !r.is_empty()) {
        None => reply.metadata.response_code = ResponseCode::NXDomain,
        Some(records) => {
            // A name with a CNAME answers it to a query of any type (RFC 1034 §3.6.2).
            for data in records.iter().filter(|d| {
                d.record_type() == question.query_type() || d.record_type() == RecordType::CNAME
            }) {
                reply.add_answer(Record::from_rdata(
                    question.name().clone(),
                    60,
                    data.clone(),
                ));
            }
        }
    }
    reply.to_vec().ok()
}
