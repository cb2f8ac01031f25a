//! The admin API: `GET/POST /workers`, `DELETE /workers/{id}`, guarded by `--admin-api-key`.
