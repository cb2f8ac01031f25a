//! A `grpc://` worker's tokenizer, fetched from the worker when the flags give its model none
//! (`GetTokenizer`, unless `--disable-tokenizer-autoload`).
//!
//! The engine streams its tokenizer files as a zip archive in `GetTokenizerChunk` pieces, the
//! last one carrying the archive's SHA-256. The control core reads the stream (bounded by
//! [`TOKENIZER_ARCHIVE_BYTES_MAX`]), then a thread of its own checks the digest, reads
//! `tokenizer.json`, `tokenizer_config.json` and `chat_template.jinja` out of the archive by
//! name into memory (nothing is written to disk, so no entry name can reach a path), builds the
//! model's tokenizer and publishes it in the `TokenizerSet` the data cores read lock-free.
//!
//! One fetch per model at a time: a model whose fetch failed on the way (worker unreachable)
//! is tried again at the next catalog change; one whose archive was refused (digest, size,
//! contents) stays refused, logged as an error, until kvgate restarts: the worker is broken.
//! Owns [`TokenizerFetches`] and [`unpack`].

use std::cell::RefCell;
use std::collections::HashSet;
use std::io::{Cursor, Read};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::engine_proto::common_pb::{GetTokenizerChunk, GetTokenizerRequest};
use crate::grpc::backend::{self, Method, ServicePaths};
use crate::grpc::status::Code;
use crate::grpc::{framing, Backend, Call, CallError, Connection};
use crate::limits::TOKENIZER_ARCHIVE_BYTES_MAX;
use crate::shared::Shared;
use crate::tokenize::{ModelTokenizer, TokenizerFiles, TokenizerSet};
use crate::workers::catalog::ModelCatalog;
use crate::workers::spec::{WorkerProtocol, WorkerSpec};

/// How long one `GetTokenizer` call may take, connection included: tens of megabytes at the
/// slowest link an engine sits behind, with room.
const FETCH_TIMEOUT: Duration = Duration::from_secs(120);

/// The models whose tokenizer is being fetched or was refused (control core only).
#[derive(Debug, Default)]
pub struct TokenizerFetches {
    started: Rc<RefCell<HashSet<String>>>,
}

impl TokenizerFetches {
    /// Starts a fetch (a task on the control core's runtime) for each model of `catalog` that
    /// a gRPC worker serves and that wants its worker's tokenizer.
    pub fn start_wanted(&self, shared: &Shared, catalog: &ModelCatalog) {
        let set = &shared.config.tokenizers;
        let roster = shared.table.roster();
        for (model, workers) in catalog.serving() {
            if !set.wants_fetch(model) || self.started.borrow().contains(model) {
                continue;
            }
            let grpc = workers
                .iter()
                .filter_map(|id| roster.get(*id))
                .find_map(|w| match w.spec.protocol {
                    WorkerProtocol::Grpc(backend) => Some((w.spec.clone(), backend)),
                    WorkerProtocol::Http => None,
                });
            let Some((spec, backend)) = grpc else {
                continue;
            };
            self.started.borrow_mut().insert(model.to_owned());
            let fetch = Fetch {
                model: model.to_owned(),
                spec,
                backend,
                bearer: shared.config.api_key.as_deref().map(Arc::from),
                set: shared.config.tokenizers.clone(),
                started: self.started.clone(),
            };
            monoio::spawn(fetch.run());
        }
    }
}

/// One model's fetch, from one of its workers.
struct Fetch {
    model: String,
    spec: WorkerSpec,
    backend: Option<Backend>,
    bearer: Option<Arc<str>>,
    set: Arc<TokenizerSet>,
    started: Rc<RefCell<HashSet<String>>>,
}

impl Fetch {
    async fn run(self) {
        let (model, url) = (self.model.as_str(), self.spec.url.as_str());
        tracing::info!(
            model,
            worker = url,
            "fetching the model's tokenizer from its worker (GetTokenizer)"
        );
        let fetched = monoio::time::timeout(FETCH_TIMEOUT, self.archive()).await;
        let (archive, sha256) = match fetched {
            Ok(Ok(answer)) => answer,
            Ok(Err(FetchError::Refused(why))) => {
                tracing::error!(model, worker = url, "the worker's tokenizer is refused: {why}; requests for this model need input_ids (or give --tokenizer-path)");
                return;
            }
            Ok(Err(FetchError::Failed(why))) => {
                tracing::warn!(
                    model,
                    worker = url,
                    "GetTokenizer failed: {why}; tried again when the model's workers change"
                );
                self.started.borrow_mut().remove(model);
                return;
            }
            Err(_) => {
                tracing::warn!(model, worker = url, "GetTokenizer took over {FETCH_TIMEOUT:?}; tried again when the model's workers change");
                self.started.borrow_mut().remove(model);
                return;
            }
        };
        // Checking, unpacking and building the tokenizer take a CPU for a while: off the
        // control core.
        let (model, url, set) = (self.model.clone(), self.spec.url.clone(), self.set.clone());
        let loading = std::thread::Builder::new()
            .name("kvgate-tokenizer-load".into())
            .spawn(move || load(&model, &url, &archive, &sha256, &set));
        if let Err(e) = loading {
            tracing::error!(
                model = self.model,
                "the fetched tokenizer could not be loaded: {e}"
            );
        }
    }

    /// The archive and the SHA-256 the worker gives for it.
    async fn archive(&self) -> Result<(Vec<u8>, String), FetchError> {
        let failed = |e: &dyn std::fmt::Display| FetchError::Failed(e.to_string());
        let connection = Connection::open(self.spec.addr, self.bearer.clone())
            .await
            .map_err(|e| failed(&e))?;
        let authority = self.spec.authority.as_str();
        let backend = match self.backend {
            Some(backend) => backend,
            None => backend::detect(&connection, authority)
                .await
                .map_err(|e| failed(&e))?,
        };
        let path = backend.path(Method::GetTokenizer);
        let message = framing::encode(&GetTokenizerRequest {});
        // An engine without the method will not grow it: refused, not tried again.
        let call_failed = |e: CallError| match e {
            CallError::Status(s) if s.code == Code::Unimplemented => {
                FetchError::Refused("the worker does not serve GetTokenizer".into())
            }
            e => failed(&e),
        };
        let mut call = Call::start(&connection, authority, path, message)
            .await
            .map_err(call_failed)?;
        let (mut archive, mut sha256) = (Vec::new(), String::new());
        while let Some(message) = call.message().await.map_err(call_failed)? {
            let chunk = GetTokenizerChunk::decode(message)
                .map_err(|e| FetchError::Refused(format!("a malformed GetTokenizerChunk: {e}")))?;
            if archive.len() + chunk.data.len() > TOKENIZER_ARCHIVE_BYTES_MAX {
                call.cancel();
                return Err(FetchError::Refused(format!(
                    "the archive is over {TOKENIZER_ARCHIVE_BYTES_MAX} bytes"
                )));
            }
            archive.extend_from_slice(&chunk.data);
            if !chunk.sha256.is_empty() {
                sha256 = chunk.sha256;
            }
        }
        Ok((archive, sha256))
    }
}

/// Why a fetch ended without an archive.
enum FetchError {
    /// On the way (connection, call): worth another try.
    Failed(String),
    /// The worker's answer is wrong: not tried again.
    Refused(String),
}

/// Checks, unpacks and builds `model`'s tokenizer from `archive`, and publishes it.
fn load(model: &str, url: &str, archive: &[u8], sha256: &str, set: &TokenizerSet) {
    let files = match unpack(archive, sha256) {
        Ok(files) => files,
        Err(why) => {
            tracing::error!(model, worker = url, "the worker's tokenizer is refused: {why}; requests for this model need input_ids (or give --tokenizer-path)");
            return;
        }
    };
    let tokenizer = match ModelTokenizer::new(model, files) {
        Ok(tokenizer) => Arc::new(tokenizer),
        Err(e) => {
            tracing::error!(
                model,
                worker = url,
                "the worker's tokenizer is refused: {e}"
            );
            return;
        }
    };
    for note in tokenizer.notes() {
        tracing::warn!("{note}");
    }
    tracing::info!(model, worker = url, encoder = %tokenizer.encoder(), bytes = archive.len(), "tokenizer fetched from the worker and loaded");
    set.publish(model, tokenizer.clone());
    // The detokenizer's table, now rather than on the first request.
    tokenizer.decode_table();
}

/// The tokenizer files in `archive`, once its SHA-256 is `sha256` (hex, any case). Entries are
/// found by file name (at the archive's root or in one directory) and read into memory, each
/// bounded by [`TOKENIZER_ARCHIVE_BYTES_MAX`]; `Err` says what is wrong.
pub fn unpack(archive: &[u8], sha256: &str) -> Result<TokenizerFiles, String> {
    let digest = format!("{:x}", Sha256::digest(archive));
    if !digest.eq_ignore_ascii_case(sha256.trim()) {
        return Err(format!(
            "SHA-256 mismatch: the worker says {sha256:?}, the {} bytes received hash to {digest}",
            archive.len()
        ));
    }
    let mut zip = zip::ZipArchive::new(Cursor::new(archive))
        .map_err(|e| format!("not a zip archive: {e}"))?;
    let tokenizer_json =
        entry(&mut zip, "tokenizer.json")?.ok_or("the archive has no tokenizer.json")?;
    let tokenizer_config_json = entry(&mut zip, "tokenizer_config.json")?;
    let chat_template = match entry(&mut zip, "chat_template.jinja")? {
        Some(bytes) => Some(
            String::from_utf8(bytes).map_err(|_| "chat_template.jinja is not UTF-8".to_string())?,
        ),
        None => None,
    };
    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config_json,
        chat_template,
    })
}

/// The contents of the entry named `name` (its last path component), the shallowest if
/// several; `None` when there is none.
fn entry(zip: &mut zip::ZipArchive<Cursor<&[u8]>>, name: &str) -> Result<Option<Vec<u8>>, String> {
    let found = zip
        .file_names()
        .filter(|path| *path == name || path.ends_with(&format!("/{name}")))
        .min_by_key(|path| path.len())
        .map(str::to_owned);
    let Some(path) = found else {
        return Ok(None);
    };
    let file = zip.by_name(&path).map_err(|e| format!("{path}: {e}"))?;
    let cap = TOKENIZER_ARCHIVE_BYTES_MAX as u64;
    let mut out = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("{path}: {e}"))?;
    if out.len() as u64 > cap {
        return Err(format!("{path} unpacks to over {cap} bytes"));
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests;
