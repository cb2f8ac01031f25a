use std::io::Write;

use super::*;

/// A zip of `(name, contents)` entries.
fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, contents) in entries {
        zip.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(contents).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn sha_of(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

#[test]
fn unpacks_the_files_by_name_when_the_digest_matches() {
    let archive = zip_of(&[
        ("model/tokenizer.json", b"{\"t\":1}"),
        ("model/tokenizer_config.json", b"{\"c\":2}"),
        ("model/chat_template.jinja", b"{{ messages }}"),
        ("../../etc/evil", b"never read"),
    ]);
    let files = unpack(&archive, &sha_of(&archive).to_uppercase()).unwrap();
    assert_eq!(files.tokenizer_json, b"{\"t\":1}");
    assert_eq!(
        files.tokenizer_config_json.as_deref(),
        Some(&b"{\"c\":2}"[..])
    );
    assert_eq!(files.chat_template.as_deref(), Some("{{ messages }}"));
}

#[test]
fn a_wrong_digest_is_refused_before_the_archive_is_read() {
    let archive = zip_of(&[("tokenizer.json", b"{}")]);
    let wrong = sha_of(b"something else");
    let error = unpack(&archive, &wrong).unwrap_err();
    assert!(error.contains("SHA-256 mismatch"), "{error}");
    assert!(unpack(&archive, "")
        .unwrap_err()
        .contains("SHA-256 mismatch"));
}

#[test]
fn an_archive_without_tokenizer_json_or_not_a_zip_is_refused() {
    let archive = zip_of(&[("tokenizer_config.json", b"{}")]);
    let error = unpack(&archive, &sha_of(&archive)).unwrap_err();
    assert!(error.contains("no tokenizer.json"), "{error}");
    let junk = b"not a zip at all".to_vec();
    assert!(unpack(&junk, &sha_of(&junk))
        .unwrap_err()
        .contains("not a zip"));
}

#[test]
fn an_entry_that_unpacks_past_the_cap_is_refused() {
    // Deflate packs the zeros a thousandfold: a small archive, a large entry (a zip bomb).
    let big = vec![0u8; TOKENIZER_ARCHIVE_BYTES_MAX + 1];
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(false);
    zip.start_file("tokenizer.json", options).unwrap();
    zip.write_all(&big).unwrap();
    let archive = zip.finish().unwrap().into_inner();
    assert!(archive.len() < TOKENIZER_ARCHIVE_BYTES_MAX / 100);
    let error = unpack(&archive, &sha_of(&archive)).unwrap_err();
    assert!(error.contains("unpacks to over"), "{error}");
}
