//! The cache partition: `cache_salt`, `extra_key` and the LoRA adapter (`lora_path`, or `lora_id`
//! on `/generate`), hashed into a [`PartitionNamespace`]. Only the hash is kept: no client value
//! reaches the index.
//!
//! Each field is hashed as `tag, length (u64 LE), bytes`, in a fixed order, so no choice of values
//! can make one partition's encoding equal another's (`salt="ab", key=""` and `salt="a",
//! key="b"` differ by their lengths; a salt and an equal extra key differ by their tags).

use std::borrow::Cow;

use xxhash_rust::xxh3::Xxh3;

/// A request's cache namespace. The unpartitioned namespace is 0; every partitioned request hashes
/// to a non-zero value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionNamespace(pub u64);

impl PartitionNamespace {
    /// Requests without any partition field.
    pub const UNPARTITIONED: PartitionNamespace = PartitionNamespace(0);

    /// True for the unpartitioned namespace.
    pub fn is_unpartitioned(self) -> bool {
        self == Self::UNPARTITIONED
    }
}

/// The partition fields of one request, as read from the body. An empty string counts as unset.
#[derive(Clone, Copy, Debug, Default)]
pub struct PartitionFields<'a> {
    /// `cache_salt`.
    pub cache_salt: Option<&'a str>,
    /// `extra_key`.
    pub extra_key: Option<&'a str>,
    /// `lora_path`.
    pub lora_path: Option<&'a str>,
    /// `lora_id` (`/generate` only).
    pub lora_id: Option<&'a str>,
}

/// Domain separator so the namespace hash never equals a hash computed for another purpose.
const NAMESPACE_DOMAIN: &[u8] = b"kvgate.partition.v1";

impl PartitionFields<'_> {
    /// The namespace these fields select.
    pub fn namespace(&self) -> PartitionNamespace {
        let fields = [
            (1u8, self.cache_salt),
            (2u8, self.extra_key),
            (3u8, self.lora_path),
            (4u8, self.lora_id),
        ];
        if fields.iter().all(|(_, v)| v.is_none_or(str::is_empty)) {
            return PartitionNamespace::UNPARTITIONED;
        }
        let mut hasher = Xxh3::new();
        hasher.update(NAMESPACE_DOMAIN);
        for (tag, value) in fields {
            let value = value.unwrap_or("");
            hasher.update(&[tag]);
            hasher.update(&(value.len() as u64).to_le_bytes());
            hasher.update(value.as_bytes());
        }
        // 0 is reserved for "unpartitioned": a partitioned request never lands there.
        PartitionNamespace(hasher.digest().max(1))
    }
}

/// Partition values as found in a body, borrowed unless they contained escapes: what both body
/// readers (`scan`, and its reference `body`) fill.
#[derive(Default)]
pub(super) struct RawPartition<'b> {
    pub(super) cache_salt: Option<Cow<'b, str>>,
    pub(super) extra_key: Option<Cow<'b, str>>,
    pub(super) lora_path: Option<Cow<'b, str>>,
    pub(super) lora_id: Option<Cow<'b, str>>,
}

impl RawPartition<'_> {
    /// The fields, borrowed, for hashing into a namespace.
    pub(super) fn fields(&self) -> PartitionFields<'_> {
        PartitionFields {
            cache_salt: self.cache_salt.as_deref(),
            extra_key: self.extra_key.as_deref(),
            lora_path: self.lora_path.as_deref(),
            lora_id: self.lora_id.as_deref(),
        }
    }
}
