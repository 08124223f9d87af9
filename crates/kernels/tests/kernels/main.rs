//! Every kernel run on the simulator against a Rust reference, plus the contract
//! failure modes the simulator must catch (understated alignment, shared elements).

mod convert;
mod elementwise;
mod estimates;
mod gelu;
mod harness;
mod layernorm;
mod layouts;
mod matmul;
mod rearrange;
mod recip_sum;
mod scale_cols;
mod scale_rows;
mod softmax;
mod softmax_cols;
mod split_softmax;
