//! A gRPC worker's `KvEventBatch` (`smg.grpc.common`, streamed by `SubscribeKvEvents`) put into
//! an [`EventBatch`], so the index applies gRPC and ZeroMQ events alike. The protobuf message
//! was decoded by the subscriber (it needs the batch's number); this maps its events with the
//! msgpack reader's rules: events of another tier or medium than the GPU's, of another KV-cache
//! group than the first, or of a remote cache are skipped and counted; a LoRA (`lora_name`, or a
//! block's `lora_id`) or a `cache_salt` salts every block of its event, so a plain request is
//! never predicted to hit them; a `Stored` event whose blocks do not each hold `block_size`
//! tokens is left out and counted as misshapen.

use xxhash_rust::xxh3::xxh3_64;

use super::{EventBatch, KvEvent};
use crate::engine_proto::common_pb::{
    kv_cache_event::Data, KvBlocksStored, KvCacheLocality, KvCacheTier, KvEventBatch,
};

impl EventBatch {
    /// Fills this batch with `batch`'s events (its previous contents are dropped).
    pub fn fill_from_grpc(&mut self, batch: &KvEventBatch) {
        self.clear();
        for event in &batch.events {
            match &event.data {
                Some(Data::Stored(stored)) => self.push_stored(stored),
                Some(Data::Removed(removed)) => {
                    let elsewhere = other_place(
                        removed.tier,
                        removed.medium.as_deref(),
                        removed.group_idx,
                        removed.locality,
                    );
                    if elsewhere {
                        self.skipped += 1;
                        continue;
                    }
                    let start = self.hashes.len();
                    let hashes = removed.block_hashes.iter().map(|h| *h as u64);
                    self.hashes.extend(hashes);
                    self.events.push(KvEvent::Removed {
                        hashes: start..self.hashes.len(),
                    });
                }
                Some(Data::Cleared(_)) => self.events.push(KvEvent::Cleared),
                // An event type this gateway does not know yet.
                None => self.skipped += 1,
            }
        }
    }

    fn push_stored(&mut self, stored: &KvBlocksStored) {
        let elsewhere = other_place(
            stored.tier,
            stored.medium.as_deref(),
            stored.group_idx,
            stored.locality,
        );
        if elsewhere {
            self.skipped += 1;
            return;
        }
        let block_size = stored.blocks.first().map_or(0, |b| b.block_size);
        let filled = u32::try_from(block_size).ok().filter(|size| {
            *size > 0
                && stored
                    .blocks
                    .iter()
                    .all(|b| b.block_size == block_size && b.token_ids.len() == *size as usize)
        });
        let Some(block_size) = filled else {
            self.misshapen += 1;
            return;
        };
        let hashes_start = self.hashes.len();
        let tokens_start = self.tokens.len();
        for block in &stored.blocks {
            self.hashes.push(block.block_hash as u64);
            self.tokens.extend_from_slice(&block.token_ids);
        }
        let blocks = stored.blocks.len();
        // One salt for the event: a LoRA or a cache salt changes every block's hash.
        let lora = stored
            .lora_name
            .as_deref()
            .map(|name| xxh3_64(name.as_bytes()))
            .or_else(|| {
                let id = stored.blocks.iter().find_map(|b| b.lora_id)?;
                Some(xxh3_64(&id.to_le_bytes()))
            });
        let salt = stored.cache_salt.as_deref().map(|s| xxh3_64(s.as_bytes()));
        let salts = match (lora, salt) {
            (None, None) => 0..0,
            (lora, salt) => {
                let start = self.salts.len();
                let folded = xxh3_64(
                    &[lora.unwrap_or(0), salt.unwrap_or(0)]
                        .map(u64::to_le_bytes)
                        .concat(),
                );
                self.salts.resize(start + blocks, folded.max(1));
                start..self.salts.len()
            }
        };
        self.events.push(KvEvent::Stored {
            hashes: hashes_start..self.hashes.len(),
            parent: stored.parent_block_hash.map(|h| h as u64),
            tokens: tokens_start..self.tokens.len(),
            block_size,
            salts,
        });
    }
}

/// Whether an event names another place than the GPU's own prefix cache: a host, disk or
/// external tier, a medium other than `GPU`, a KV-cache group other than the first, or a
/// remote cache.
fn other_place(
    tier: Option<i32>,
    medium: Option<&str>,
    group_idx: Option<u32>,
    locality: Option<i32>,
) -> bool {
    let device = |tier: i32| {
        matches!(
            KvCacheTier::try_from(tier),
            Ok(KvCacheTier::Unspecified | KvCacheTier::Device)
        )
    };
    tier.is_some_and(|t| !device(t))
        || medium.is_some_and(|m| !m.eq_ignore_ascii_case("GPU"))
        || group_idx.is_some_and(|g| g != 0)
        || locality.is_some_and(|l| l == KvCacheLocality::Remote as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine_proto::common_pb::{KvBlock, KvBlocksRemoved, KvCacheCleared, KvCacheEvent};

    fn block(hash: i64, tokens: &[u32]) -> KvBlock {
        KvBlock {
            block_hash: hash,
            token_ids: tokens.to_vec(),
            block_size: tokens.len() as i32,
            ..Default::default()
        }
    }

    fn event(data: Data) -> KvCacheEvent {
        KvCacheEvent {
            event_id: 0,
            data: Some(data),
        }
    }

    #[test]
    fn stored_removed_and_cleared_map_to_the_index_events() {
        let stored = KvBlocksStored {
            blocks: vec![block(-5, &[1, 2]), block(7, &[3, 4])],
            parent_block_hash: Some(9),
            ..Default::default()
        };
        let removed = KvBlocksRemoved {
            block_hashes: vec![7],
            ..Default::default()
        };
        let batch = KvEventBatch {
            sequence_number: 3,
            events: vec![
                event(Data::Stored(stored)),
                event(Data::Removed(removed)),
                event(Data::Cleared(KvCacheCleared::default())),
            ],
            ..Default::default()
        };
        let mut out = EventBatch::default();
        out.fill_from_grpc(&batch);
        let [KvEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            salts,
        }, KvEvent::Removed { hashes: removed }, KvEvent::Cleared] = out.events()
        else {
            panic!("{:?}", out.events());
        };
        assert_eq!(out.hashes(hashes), [(-5i64) as u64, 7]);
        assert_eq!((*parent, *block_size), (Some(9), 2));
        assert_eq!(out.tokens(tokens), [1, 2, 3, 4]);
        assert!(salts.is_empty());
        assert_eq!(out.hashes(removed), [7]);
        assert_eq!((out.skipped(), out.misshapen()), (0, 0));
    }

    #[test]
    fn other_tiers_groups_and_misshapen_blocks_are_left_out_and_counted() {
        let host = KvBlocksStored {
            blocks: vec![block(1, &[1])],
            tier: Some(KvCacheTier::Host as i32),
            ..Default::default()
        };
        let group = KvBlocksRemoved {
            block_hashes: vec![1],
            group_idx: Some(1),
            ..Default::default()
        };
        let mut short = block(2, &[1]);
        short.block_size = 2;
        let misshapen = KvBlocksStored {
            blocks: vec![short],
            ..Default::default()
        };
        let salted = KvBlocksStored {
            blocks: vec![block(3, &[1]), block(4, &[2])],
            lora_name: Some("adapter".into()),
            ..Default::default()
        };
        let batch = KvEventBatch {
            events: vec![
                event(Data::Stored(host)),
                event(Data::Removed(group)),
                event(Data::Stored(misshapen)),
                event(Data::Stored(salted)),
                KvCacheEvent::default(),
            ],
            ..Default::default()
        };
        let mut out = EventBatch::default();
        out.fill_from_grpc(&batch);
        assert_eq!((out.skipped(), out.misshapen()), (3, 1));
        let [KvEvent::Stored { salts, .. }] = out.events() else {
            panic!("{:?}", out.events());
        };
        let salts = out.salts(salts);
        assert_eq!(salts.len(), 2);
        assert!(salts.iter().all(|s| *s != 0), "a LoRA salts every block");
    }
}
