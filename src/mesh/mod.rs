//! Gateway-to-gateway synchronization of tree inserts (`--enable-mesh`). Not built yet.
