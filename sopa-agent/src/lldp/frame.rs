//! LLDP frames (IEEE 802.1AB) as SOPA's agents send and read them: the mandatory chassis ID,
//! port ID and TTL TLVs, the system name, and the end. The chassis ID is the node's name
//! (subtype 7, locally assigned), the port ID its interface's name (subtype 5), so a neighbour's
//! frame names the very `switch:port` an inventory lists. Frames of other speakers (lldpd, a
//! switch's own agent) are read too: whatever subtypes they use, the chassis and port IDs are
//! taken as text where they are text, and the system name, where given, names the chassis.

/// The LLDP EtherType.
pub const ETH_P_LLDP: u16 = 0x88CC;
/// The nearest-bridge group address every LLDP frame goes to.
pub const NEAREST_BRIDGE: [u8; 6] = [0x01, 0x80, 0xC2, 0x00, 0x00, 0x0E];

const END: u8 = 0;
const CHASSIS_ID: u8 = 1;
const PORT_ID: u8 = 2;
const TTL: u8 = 3;
const SYSTEM_NAME: u8 = 5;
const CHASSIS_LOCAL: u8 = 7;
const PORT_IFNAME: u8 = 5;
/// A TLV's value holds at most 511 bytes; IDs at most 255.
const MAX_ID: usize = 255;

/// What one frame says about its sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lldpdu {
    /// The sender's name: its system name where it gives one, else its chassis ID as text.
    pub chassis: String,
    /// The sending port's name.
    pub port: String,
    /// Seconds the receiver keeps this; 0: forget the sender's port now (its shutdown).
    pub ttl_s: u16,
}

fn tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    let len = value.len().min(511);
    out.extend_from_slice(&((u16::from(kind) << 9) | len as u16).to_be_bytes());
    out.extend_from_slice(&value[..len]);
}

/// The LLDPDU (the frame's payload after the Ethernet header) for `node`'s port `port`.
pub fn encode(node: &str, port: &str, ttl_s: u16) -> Vec<u8> {
    let clip = |s: &str| s.as_bytes()[..s.len().min(MAX_ID)].to_vec();
    let mut out = Vec::with_capacity(32 + node.len() * 2 + port.len());
    tlv(
        &mut out,
        CHASSIS_ID,
        &[&[CHASSIS_LOCAL][..], &clip(node)].concat(),
    );
    tlv(
        &mut out,
        PORT_ID,
        &[&[PORT_IFNAME][..], &clip(port)].concat(),
    );
    tlv(&mut out, TTL, &ttl_s.to_be_bytes());
    tlv(&mut out, SYSTEM_NAME, &clip(node));
    tlv(&mut out, END, &[]);
    out
}

/// An ID TLV's value as text: printable UTF-8 after the subtype byte, or the bytes in hex (a
/// MAC address chassis ID, say) joined by colons.
fn id_text(value: &[u8]) -> Option<String> {
    let (_, id) = value.split_first()?;
    if id.is_empty() {
        return None;
    }
    match std::str::from_utf8(id) {
        Ok(s) if s.chars().all(|c| !c.is_control()) => Some(s.to_owned()),
        _ => Some(
            id.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":"),
        ),
    }
}

/// Reads an LLDPDU; `None` for anything that is not a well-formed one (the three mandatory
/// TLVs first, in order, as the standard requires).
pub fn decode(mut b: &[u8]) -> Option<Lldpdu> {
    let mut chassis = None;
    let mut port = None;
    let mut ttl = None;
    let mut name = None;
    let mut index = 0;
    while b.len() >= 2 {
        let head = u16::from_be_bytes([b[0], b[1]]);
        let (kind, len) = ((head >> 9) as u8, usize::from(head & 0x1FF));
        let value = b.get(2..2 + len)?;
        b = &b[2 + len..];
        match (index, kind) {
            (_, END) => break,
            (0, CHASSIS_ID) => chassis = id_text(value),
            (1, PORT_ID) => port = id_text(value),
            (2, TTL) => ttl = value.try_into().ok().map(u16::from_be_bytes),
            (0..=2, _) => return None,
            (_, SYSTEM_NAME) => {
                name = std::str::from_utf8(value)
                    .ok()
                    .filter(|s| !s.is_empty() && !s.contains(char::is_control))
                    .map(str::to_owned)
            }
            _ => {}
        }
        index += 1;
    }
    Some(Lldpdu {
        chassis: name.or(chassis)?,
        port: port?,
        ttl_s: ttl?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back() {
        let f = encode("sp-1", "swp3", 20);
        assert_eq!(
            decode(&f),
            Some(Lldpdu {
                chassis: "sp-1".into(),
                port: "swp3".into(),
                ttl_s: 20
            })
        );
        // Type 1 length 5, subtype 7.
        assert_eq!(&f[..3], &[0x02, 0x05, 0x07]);
    }

    #[test]
    fn another_speakers_frame_reads_by_its_system_name() {
        // lldpd's defaults: chassis ID a MAC (subtype 4), port ID the ifname (subtype 5).
        let mut f = Vec::new();
        tlv(&mut f, CHASSIS_ID, &[4, 0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        tlv(&mut f, PORT_ID, &[5, b'e', b't', b'h', b'1']);
        tlv(&mut f, TTL, &120u16.to_be_bytes());
        tlv(&mut f, 4, b"uplink to spine");
        tlv(&mut f, SYSTEM_NAME, b"leaf7");
        tlv(&mut f, END, &[]);
        let d = decode(&f).unwrap();
        assert_eq!(
            (d.chassis.as_str(), d.port.as_str(), d.ttl_s),
            ("leaf7", "eth1", 120)
        );
        // Without a system name, the MAC in hex.
        let mut g = f[..f.len() - 2 - 2 - 5].to_vec();
        tlv(&mut g, END, &[]);
        assert_eq!(decode(&g).unwrap().chassis, "52:54:00:12:34:56");
    }

    #[test]
    fn malformed_frames_are_refused() {
        let f = encode("sp-1", "swp3", 20);
        for cut in [0, 1, 3, 8, 12] {
            assert_eq!(decode(&f[..cut]), None, "cut at {cut}");
        }
        // TTL before the port ID: out of order.
        let mut g = Vec::new();
        tlv(&mut g, CHASSIS_ID, &[7, b'a']);
        tlv(&mut g, TTL, &[0, 9]);
        tlv(&mut g, PORT_ID, &[5, b'p']);
        assert_eq!(decode(&g), None);
        // Long names are clipped to what a TLV holds, not refused.
        let long = "x".repeat(400);
        assert_eq!(
            decode(&encode(&long, "p", 1)).unwrap().chassis.len(),
            MAX_ID
        );
    }
}
