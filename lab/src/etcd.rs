//! etcd (being written)
