//! The replay harness behind `replay`.
