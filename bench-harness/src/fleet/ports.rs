//! Free loopback ports for the processes a fleet starts: [`free_ports`] (one block of
//! consecutive ports, as `sim-engine --engines N` binds) and [`free_port_blocks`] (several blocks
//! that do not overlap, found at once).
//!
//! Ports are drawn below Linux's ephemeral range (32768 and up, `net.ipv4.ip_local_port_range`),
//! where the kernel picks the source port of every outgoing connection: a port found free there
//! can be taken by one of the harness's own connections (a probe, a replay client) before the
//! process it was meant for binds it. Below it only another process that binds explicitly can
//! take it, and a caller that starts a process on a found block retries on a new one when the
//! process cannot bind.

use std::net::TcpListener;

/// The lowest port drawn: above the well-known and the commonly registered services' ports.
pub const PORTS_LOW: u16 = 20_000;

/// One past the highest port drawn: just below the ephemeral range (see the module's header).
pub const PORTS_END: u16 = 32_000;

/// Draws before giving up: a loaded machine has a few hundred ports bound in the range at most,
/// so a handful of draws finds a block; 200 failures mean the range is full.
const DRAWS_MAX: usize = 200;

/// The first of `count` consecutive ports on 127.0.0.1 that were all free a moment ago.
pub fn free_ports(count: u16) -> Result<u16, String> {
    Ok(free_port_blocks(&[count])?[0])
}

/// For each of `counts`, the first port of a block of that many consecutive free ports; the
/// blocks do not overlap (each is held bound while the next is drawn).
pub fn free_port_blocks(counts: &[u16]) -> Result<Vec<u16>, String> {
    let mut held: Vec<TcpListener> = Vec::new();
    let mut bases = Vec::with_capacity(counts.len());
    for &count in counts {
        if count == 0 || count > PORTS_END - PORTS_LOW {
            return Err(format!(
                "a block of {count} ports: between 1 and {} fit below the ephemeral range",
                PORTS_END - PORTS_LOW
            ));
        }
        let block = (0..DRAWS_MAX).find_map(|_| {
            let base = fastrand::u16(PORTS_LOW..=PORTS_END - count);
            let listeners: Result<Vec<TcpListener>, _> = (0..count)
                .map(|i| TcpListener::bind(("127.0.0.1", base + i)))
                .collect();
            listeners.ok().map(|listeners| (base, listeners))
        });
        let Some((base, listeners)) = block else {
            return Err(format!(
                "no block of {count} free ports on 127.0.0.1 between {PORTS_LOW} and {PORTS_END}"
            ));
        };
        bases.push(base);
        held.extend(listeners);
    }
    Ok(bases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_free_below_the_ephemeral_range_and_apart() {
        let bases = free_port_blocks(&[8, 1, 3]).unwrap();
        let blocks: Vec<(u16, u16)> = bases
            .iter()
            .zip([8, 1, 3])
            .map(|(&b, n)| (b, b + n))
            .collect();
        for &(start, end) in &blocks {
            assert!(PORTS_LOW <= start && end <= PORTS_END, "{blocks:?}");
            for port in start..end {
                assert!(
                    TcpListener::bind(("127.0.0.1", port)).is_ok(),
                    "{port} is taken"
                );
            }
        }
        for (i, a) in blocks.iter().enumerate() {
            for b in &blocks[i + 1..] {
                assert!(a.1 <= b.0 || b.1 <= a.0, "{blocks:?} overlap");
            }
        }
    }

    #[test]
    fn a_block_too_large_or_empty_is_refused() {
        assert!(free_ports(0).is_err());
        assert!(free_ports(PORTS_END - PORTS_LOW + 1).is_err());
    }
}
