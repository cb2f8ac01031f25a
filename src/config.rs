//! The command line (SMG's flag names and defaults) and the validated configuration built from it.
