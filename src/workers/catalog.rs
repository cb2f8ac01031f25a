//! Model discovery: which workers serve which model, and the gateway's own `/v1/models` answer.
//!
//! Owns [`parse_models`] (a worker's OpenAI-style `/v1/models` body into [`ListedModel`]s),
//! [`ModelCatalog`] (built by the control core from every worker's list and published as an
//! immutable snapshot: data cores read [`ModelCatalog::workers_for`] per request and serve
//! [`ModelCatalog::models_body`] as `GET /v1/models`) and [`ModelWorkers`] (the workers a request
//! for one model may go to). A malformed list is a [`ModelsError`]; the control core then keeps
//! what it knew, since no signal is never a penalty. An unknown model is `None` (a 404 there).

use std::collections::HashMap;

use serde::Deserialize;

use crate::ids::WorkerId;
use crate::limits::{EOS_TOKEN_IDS_MAX, MODELS_PER_WORKER_MAX, MODEL_ID_BYTES_MAX};

/// One model a worker lists: its id, and its entry as the worker sent it (the gateway's
/// `/v1/models` passes entries through unchanged).
#[derive(Clone, Debug, PartialEq)]
pub struct ListedModel {
    /// The model id requests name in their `model` field.
    pub id: String,
    /// The whole `data[]` entry.
    pub entry: serde_json::Value,
    /// The model's EOS token IDs, when its worker told them (a gRPC worker's `GetModelInfo`,
    /// carried as the entry's `eos_token_ids` and taken out of it: no engine lists them).
    pub eos_token_ids: Vec<u32>,
}

/// A `/v1/models` body that is not a usable model list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed /v1/models: {0}")]
pub struct ModelsError(String);

#[derive(Deserialize)]
struct ModelsBody {
    data: Vec<serde_json::Value>,
}

/// Parses an OpenAI-style `/v1/models` body (`{"data":[{"id":...}, ...]}`); a repeated id keeps
/// its first entry.
pub fn parse_models(body: &[u8]) -> Result<Vec<ListedModel>, ModelsError> {
    let parsed: ModelsBody =
        serde_json::from_slice(body).map_err(|e| ModelsError(e.to_string()))?;
    if parsed.data.len() > MODELS_PER_WORKER_MAX {
        let count = parsed.data.len();
        return Err(ModelsError(format!(
            "{count} models listed, at most {MODELS_PER_WORKER_MAX} kept"
        )));
    }
    let mut models: Vec<ListedModel> = Vec::with_capacity(parsed.data.len());
    for mut entry in parsed.data {
        let eos_token_ids = take_eos_token_ids(&mut entry);
        let id = match entry.get("id").and_then(|id| id.as_str()) {
            Some(id) if !id.is_empty() && id.len() <= MODEL_ID_BYTES_MAX => id.to_string(),
            _ => return Err(ModelsError("an entry without a valid id".to_string())),
        };
        if !models.iter().any(|m| m.id == id) {
            models.push(ListedModel {
                id,
                entry,
                eos_token_ids,
            });
        }
    }
    Ok(models)
}

/// An entry's `eos_token_ids`, taken out of it (at most `EOS_TOKEN_IDS_MAX`; others than
/// 32-bit IDs left out).
fn take_eos_token_ids(entry: &mut serde_json::Value) -> Vec<u32> {
    let Some(ids) = entry
        .as_object_mut()
        .and_then(|e| e.remove("eos_token_ids"))
    else {
        return Vec::new();
    };
    let ids = ids.as_array().map(Vec::as_slice).unwrap_or_default();
    ids.iter()
        .filter_map(|id| u32::try_from(id.as_u64()?).ok())
        .take(EOS_TOKEN_IDS_MAX)
        .collect()
}

/// Which workers serve which model. Workers whose models are unknown (discovery failed or not
/// yet run) serve every model: no signal is never a penalty.
#[derive(Debug, Clone)]
pub struct ModelCatalog {
    by_model: HashMap<String, Vec<WorkerId>>,
    wildcard: Vec<WorkerId>,
    /// Each worker's engine as its first listed model names it (`owned_by`: `sglang`,
    /// `vllm`), which PD mode reads when `--backend` is absent (SMG's detection).
    owners: HashMap<WorkerId, String>,
    /// Each worker's EOS token IDs as its first listed model gives them (gRPC workers).
    eos: HashMap<WorkerId, Vec<u32>>,
    /// The gateway's `/v1/models` answer: every listed model once, the first worker's entry.
    body: Vec<u8>,
}

impl Default for ModelCatalog {
    fn default() -> Self {
        ModelCatalog::build(std::iter::empty())
    }
}

/// The workers a request for a model may go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelWorkers<'a> {
    /// No restriction: every eligible worker.
    Any,
    /// Only the workers serving the model, plus those whose models are unknown.
    Only {
        /// Workers that list the model.
        serving: &'a [WorkerId],
        /// Workers whose model list is unknown (they serve anything).
        wildcard: &'a [WorkerId],
    },
}

impl ModelWorkers<'_> {
    /// Whether worker `id` may serve the request.
    pub fn allows(&self, id: WorkerId) -> bool {
        match self {
            ModelWorkers::Any => true,
            ModelWorkers::Only { serving, wildcard } => {
                serving.contains(&id) || wildcard.contains(&id)
            }
        }
    }
}

impl ModelCatalog {
    /// Builds the catalog from each worker's discovered models (`None`: unknown), in worker order.
    pub fn build<'a>(workers: impl Iterator<Item = (WorkerId, Option<&'a [ListedModel]>)>) -> Self {
        let mut by_model: HashMap<String, Vec<WorkerId>> = HashMap::new();
        let mut wildcard = Vec::new();
        let mut entries: Vec<&serde_json::Value> = Vec::new();
        let mut owners = HashMap::new();
        let mut eos = HashMap::new();
        for (id, models) in workers {
            let Some(models) = models else {
                wildcard.push(id);
                continue;
            };
            if let Some(first) = models.first().filter(|m| !m.eos_token_ids.is_empty()) {
                eos.insert(id, first.eos_token_ids.clone());
            }
            let owner = models.first().and_then(|m| m.entry.get("owned_by"));
            if let Some(owner) = owner.and_then(|o| o.as_str()) {
                owners.insert(id, owner.to_string());
            }
            for model in models {
                let holders = by_model.entry(model.id.clone()).or_default();
                if holders.is_empty() {
                    entries.push(&model.entry);
                }
                holders.push(id);
            }
        }
        let answer = serde_json::json!({ "object": "list", "data": entries });
        ModelCatalog {
            by_model,
            wildcard,
            owners,
            eos,
            // Serializing a `Value` into a Vec cannot fail.
            body: serde_json::to_vec(&answer).unwrap_or_default(),
        }
    }

    /// Every model listed, with the workers that list it.
    pub fn serving(&self) -> impl Iterator<Item = (&str, &[WorkerId])> {
        self.by_model
            .iter()
            .map(|(m, w)| (m.as_str(), w.as_slice()))
    }

    /// The `owned_by` of worker `id`'s first listed model (`None`: not listed, or no owner).
    pub fn owner_of(&self, id: WorkerId) -> Option<&str> {
        self.owners.get(&id).map(String::as_str)
    }

    /// Worker `id`'s EOS token IDs, as its `GetModelInfo` told them (empty: unknown).
    pub fn eos_token_ids(&self, id: WorkerId) -> &[u32] {
        self.eos.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Workers that serve every model.
    pub fn wildcard(&self) -> &[WorkerId] {
        &self.wildcard
    }

    /// The workers a request for `model` may go to; `None` when no worker serves it (a 404). A
    /// request without a model, or a catalog where no worker listed models, is unrestricted.
    pub fn workers_for(&self, model: &str) -> Option<ModelWorkers<'_>> {
        if model.is_empty() || self.by_model.is_empty() {
            return Some(ModelWorkers::Any);
        }
        let wildcard = &self.wildcard[..];
        match self.by_model.get(model) {
            Some(serving) => Some(ModelWorkers::Only { serving, wildcard }),
            None if !wildcard.is_empty() => Some(ModelWorkers::Only {
                serving: &[],
                wildcard,
            }),
            None => None,
        }
    }

    /// Every model id served, sorted.
    pub fn models(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self.by_model.keys().map(String::as_str).collect();
        ids.sort_unstable();
        ids
    }

    /// The gateway's `GET /v1/models` body.
    pub fn models_body(&self) -> &[u8] {
        &self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(ids: &[&str]) -> Vec<ListedModel> {
        let data: Vec<String> = ids.iter().map(|id| format!(r#"{{"id":"{id}"}}"#)).collect();
        parse_models(format!(r#"{{"data":[{}]}}"#, data.join(",")).as_bytes()).unwrap()
    }

    #[test]
    fn eos_token_ids_are_taken_out_of_the_entry_and_kept_per_worker() {
        let body = br#"{"data":[{"id":"m","eos_token_ids":[2,-1,7,"x"]},{"id":"n"}]}"#;
        let models = parse_models(body).unwrap();
        assert_eq!(models[0].eos_token_ids, [2, 7]);
        assert_eq!(models[0].entry, serde_json::json!({"id": "m"}));
        let catalog = ModelCatalog::build([(WorkerId(4), Some(&models[..]))].into_iter());
        assert_eq!(catalog.eos_token_ids(WorkerId(4)), [2, 7]);
        assert!(catalog.eos_token_ids(WorkerId(5)).is_empty());
        let listed: serde_json::Value = serde_json::from_slice(catalog.models_body()).unwrap();
        assert!(listed["data"][0].get("eos_token_ids").is_none(), "{listed}");
    }

    #[test]
    fn models_parse_and_reject_malformed() {
        let models = parse_models(
            br#"{"object":"list","data":[{"id":"a","object":"model"},{"id":"b"},{"id":"a"}]}"#,
        )
        .unwrap();
        let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(
            models[0].entry["object"], "model",
            "the entry is kept whole"
        );
        for bad in [
            &b"{}"[..],
            br#"{"data":[{"id":""}]}"#,
            br#"{"data":[{"name":"x"}]}"#,
            br#"{"data":[{"id":3}]}"#,
            b"[]",
            b"not json",
        ] {
            assert!(
                parse_models(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let many: Vec<String> = (0..=MODELS_PER_WORKER_MAX)
            .map(|i| format!(r#"{{"id":"m{i}"}}"#))
            .collect();
        assert!(parse_models(format!(r#"{{"data":[{}]}}"#, many.join(",")).as_bytes()).is_err());
    }

    #[test]
    fn catalog_routes_by_model() {
        let (a, b) = (listed(&["llama"]), listed(&["llama", "qwen"]));
        let catalog = ModelCatalog::build(
            [(WorkerId(0), Some(&a[..])), (WorkerId(1), Some(&b[..]))].into_iter(),
        );
        assert_eq!(catalog.workers_for(""), Some(ModelWorkers::Any));
        let llama = catalog.workers_for("llama").unwrap();
        assert!(llama.allows(WorkerId(0)) && llama.allows(WorkerId(1)));
        assert!(!llama.allows(WorkerId(2)));
        let qwen = catalog.workers_for("qwen").unwrap();
        assert!(!qwen.allows(WorkerId(0)) && qwen.allows(WorkerId(1)));
        assert_eq!(catalog.workers_for("gpt"), None);
        assert_eq!(catalog.models(), vec!["llama", "qwen"]);
        // A worker with unknown models keeps every model routable.
        let with_wild =
            ModelCatalog::build([(WorkerId(0), Some(&a[..])), (WorkerId(2), None)].into_iter());
        let gpt = with_wild.workers_for("gpt").unwrap();
        assert!(gpt.allows(WorkerId(2)) && !gpt.allows(WorkerId(0)));
        assert_eq!(with_wild.wildcard(), &[WorkerId(2)]);
        // Nobody listed models: no restriction.
        let empty = ModelCatalog::build([(WorkerId(0), None)].into_iter());
        assert_eq!(empty.workers_for("gpt"), Some(ModelWorkers::Any));
    }

    #[test]
    fn each_workers_engine_is_its_first_models_owner() {
        let vllm =
            parse_models(br#"{"data":[{"id":"m","owned_by":"vllm"},{"id":"n","owned_by":"x"}]}"#)
                .unwrap();
        let bare = listed(&["m"]);
        let catalog = ModelCatalog::build(
            [
                (WorkerId(0), Some(&vllm[..])),
                (WorkerId(1), Some(&bare[..])),
                (WorkerId(2), None),
            ]
            .into_iter(),
        );
        assert_eq!(catalog.owner_of(WorkerId(0)), Some("vllm"));
        assert_eq!(catalog.owner_of(WorkerId(1)), None);
        assert_eq!(catalog.owner_of(WorkerId(2)), None);
    }

    #[test]
    fn the_models_answer_lists_each_id_once_with_the_first_workers_entry() {
        let first = parse_models(br#"{"data":[{"id":"a","owned_by":"w0"},{"id":"b"}]}"#).unwrap();
        let second = parse_models(br#"{"data":[{"id":"b","owned_by":"w1"},{"id":"c"}]}"#).unwrap();
        let catalog = ModelCatalog::build(
            [
                (WorkerId(0), Some(&first[..])),
                (WorkerId(1), Some(&second[..])),
                (WorkerId(2), None),
            ]
            .into_iter(),
        );
        let body: serde_json::Value = serde_json::from_slice(catalog.models_body()).unwrap();
        assert_eq!(body["object"], "list");
        let ids: Vec<&str> = body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(body["data"][0]["owned_by"], "w0");
        assert!(
            body["data"][1].get("owned_by").is_none(),
            "w0's b, not w1's"
        );
        let empty: serde_json::Value =
            serde_json::from_slice(ModelCatalog::default().models_body()).unwrap();
        assert_eq!(empty, serde_json::json!({"object": "list", "data": []}));
    }
}
