//! [`BpeSlot`]: one model's [`ByteLevelBpe`], built on a thread of its own when the model loads,
//! so that start-up does not wait for it (a second in a debug build, a few hundred milliseconds
//! optimized, per model). Until it is there, and for good if the model is not one it
//! implements, the `tokenizers` crate encodes: both give the same IDs, so which one did is never
//! visible. Readers only load a `OnceLock` (an atomic), never a lock.
//!
//! Before it is used the encoder must agree with the crate on [`PROBES`]; the builder logs
//! which encoder the model uses and why (`kvgate-bpe-load` thread, info; the runtime also logs
//! [`BpeSlot::describe`] at start, in case the builder finished before logging was set up).

use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use tokenizers::Tokenizer;

use super::ByteLevelBpe;

/// Strings kvgate's BPE must encode as the crate does before a model uses it: every kind of
/// pre-token, NFC's compositions, contractions and their folds, Unicode whitespace.
const PROBES: [&str; 6] = [
    "Hello world, it's THEY'LL don't 12345 3.14 naïve café 日本語 한국어 🎉 👩‍👩‍👧",
    "  leading\t\ttabs \n\r\n  trailing   \n\n\n    indented(x) { return x**2; }",
    "x\u{301} e\u{301}\u{327} \u{1100}\u{1161}\u{11a8} ﬁ Å Ω ٣٤٥ ½ Ⅻ",
    "!!! ... ??? 'S 'ſ 'Re 'vE 'LL 'd ' \" `~ http://example.com/a?b=c&d=e#f",
    "internationalization antidisestablishmentarianism supercalifragilisticexpialidocious",
    "\u{3000}\u{a0}\u{2028}\u{85}\u{feff}\u{200d} tail",
];

/// One model's encoder slot (see the module documentation).
#[derive(Debug, Default)]
pub struct BpeSlot {
    /// The encoder, or why the crate encodes this model; empty while it is built.
    built: OnceLock<Result<ByteLevelBpe, String>>,
    builder: Mutex<Option<JoinHandle<()>>>,
}

impl BpeSlot {
    /// A slot whose model is encoded by the crate, for `reason`.
    pub fn crate_only(reason: &str) -> Arc<BpeSlot> {
        let slot = BpeSlot::default();
        let _ = slot.built.set(Err(reason.to_owned()));
        Arc::new(slot)
    }

    /// Starts building the encoder of `tokenizer_json` (model `label`, whose crate tokenizer is
    /// `tokenizer`) on its own thread.
    pub fn build(label: &str, tokenizer_json: Vec<u8>, tokenizer: Arc<Tokenizer>) -> Arc<BpeSlot> {
        let slot = Arc::new(BpeSlot::default());
        let (filled, label) = (slot.clone(), label.to_owned());
        let spawned = std::thread::Builder::new()
            .name("kvgate-bpe-load".into())
            .spawn(move || {
                let built = checked(&tokenizer_json, &tokenizer);
                match &built {
                    Ok(bpe) => tracing::info!(model = %label, "tokenizer encoded by {}", bpe.describe()),
                    Err(why) => tracing::info!(model = %label, "tokenizer encoded by the tokenizers crate: {why}"),
                }
                let _ = filled.built.set(built);
            });
        match spawned {
            Ok(handle) => *slot.lock_builder() = Some(handle),
            Err(e) => {
                let _ = slot
                    .built
                    .set(Err(format!("no thread to build kvgate's BPE: {e}")));
            }
        }
        slot
    }

    /// The encoder, once built and checked.
    #[inline]
    pub fn get(&self) -> Option<&ByteLevelBpe> {
        self.built.get().and_then(|built| built.as_ref().ok())
    }

    /// Waits for the builder; then whether kvgate's BPE encodes this model.
    pub fn wait(&self) -> bool {
        let handle = self.lock_builder().take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
        self.get().is_some()
    }

    /// Which encoder encodes the model now, and why.
    pub fn describe(&self) -> String {
        match self.built.get() {
            None => "the tokenizers crate while kvgate's byte-level BPE is built".into(),
            Some(Ok(bpe)) => bpe.describe(),
            Some(Err(why)) => format!("the tokenizers crate: {why}"),
        }
    }

    fn lock_builder(&self) -> std::sync::MutexGuard<'_, Option<JoinHandle<()>>> {
        self.builder
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The encoder of `tokenizer_json` if it implements it and agrees with the crate on [`PROBES`].
fn checked(tokenizer_json: &[u8], tokenizer: &Tokenizer) -> Result<ByteLevelBpe, String> {
    let bpe = ByteLevelBpe::new(tokenizer_json)
        .map_err(|why| format!("kvgate's BPE does not implement {why}"))?;
    for probe in PROBES {
        let mut ours = Vec::new();
        let encoded = bpe.encode(probe, &mut ours).is_ok();
        let theirs = tokenizer
            .encode_fast(probe, false)
            .map(|e| e.get_ids().to_vec());
        if !encoded || theirs.ok() != Some(ours) {
            return Err(format!("kvgate's BPE differs from it on {probe:?}"));
        }
    }
    Ok(bpe)
}
