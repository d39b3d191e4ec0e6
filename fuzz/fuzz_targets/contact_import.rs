//! A contact import, as CSV and as a JSON array: rows read up to the cap, each validated.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sender::audience::contacts::{csv_rows, json_rows, ContactInput};

fuzz_target!(|data: &[u8]| {
    for rows in [csv_rows(data), json_rows(data)] {
        if let Ok(rows) = rows {
            assert!(rows.len() <= 10_000, "more rows than the cap");
            for row in rows.into_iter().flatten() {
                let _ = ContactInput::parse(row);
            }
        }
    }
});
