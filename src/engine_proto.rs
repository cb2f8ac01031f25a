//! The engines' gRPC messages: prost types compiled by `build.rs` from `proto/smg/` (SGLang's
//! `sglang.grpc.scheduler`, vLLM's `vllm.grpc.engine`, and the `smg.grpc.common` messages both
//! use). The modules nest as the packages do, so the generated cross-package paths resolve.
//! A leaf of plain data: `grpc` sends these messages and `kv_events` reads the KV-event batches.
#![allow(missing_docs, clippy::all)]

/// Messages both engines share (`smg.grpc.common`).
pub mod smg {
    /// `smg.grpc`.
    pub mod grpc {
        /// `smg.grpc.common`: the tokenizer archive and KV-event batches.
        pub mod common {
            include!(concat!(env!("OUT_DIR"), "/smg.grpc.common.rs"));
        }
    }
}

/// SGLang's scheduler service (`sglang.grpc.scheduler`).
pub mod sglang {
    /// `sglang.grpc`.
    pub mod grpc {
        /// `sglang.grpc.scheduler`.
        pub mod scheduler {
            include!(concat!(env!("OUT_DIR"), "/sglang.grpc.scheduler.rs"));
        }
    }
}

/// vLLM's engine service (`vllm.grpc.engine`).
pub mod vllm {
    /// `vllm.grpc`.
    pub mod grpc {
        /// `vllm.grpc.engine`.
        pub mod engine {
            include!(concat!(env!("OUT_DIR"), "/vllm.grpc.engine.rs"));
        }
    }
}

pub use sglang::grpc::scheduler as sglang_pb;
pub use smg::grpc::common as common_pb;
pub use vllm::grpc::engine as vllm_pb;
