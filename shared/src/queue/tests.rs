//! The queue worker's own rules: errors classified, verdicts' texts storable.

use super::*;

#[test]
fn a_verdicts_text_holds_no_nul_for_the_database_to_refuse() {
    let failed = Failure::Permanent("550 no\0such".into());
    let verdict = Verdict::of(Err(failed), false, Duration::ZERO);
    assert!(
        matches!(&verdict, Verdict::Failed(e) if e == "550 no\u{FFFD}such"),
        "{verdict:?}"
    );
    let later = Verdict::of(Err(Failure::Transient("a\0".into())), false, Duration::ZERO);
    assert!(
        matches!(&later, Verdict::Retry(e, _) if !e.contains('\0')),
        "{later:?}"
    );
}

#[test]
fn a_lost_connection_is_unavailable_and_a_bad_statement_refused() {
    let lost = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
    for e in [
        sqlx::Error::Io(lost),
        sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed,
    ] {
        let e = StageError::from(e);
        assert!(matches!(e, StageError::Unavailable(_)), "{e}");
        assert!(matches!(retry_after(&e), Outcome::Retry(_, None)));
    }
    for e in [
        sqlx::Error::ColumnNotFound("wrong".into()),
        sqlx::Error::RowNotFound,
    ] {
        let e = StageError::from(e);
        assert!(matches!(e, StageError::Refused(_)), "{e}");
        assert!(matches!(retry_after(&e), Outcome::Retry(_, None)));
    }
}

#[test]
fn retries_back_off_doubling_up_to_a_cap() {
    let base = Duration::from_secs(5);
    assert_eq!(retry_delay(base, 1), Duration::from_secs(5));
    assert_eq!(retry_delay(base, 2), Duration::from_secs(10));
    assert_eq!(retry_delay(base, 4), Duration::from_secs(40));
    assert_eq!(retry_delay(base, 9), MAX_RETRY_DELAY);
    assert_eq!(retry_delay(base, i64::MAX), MAX_RETRY_DELAY);
    assert_eq!(retry_delay(base, 0), base);
}

#[test]
fn a_job_ends_as_its_most_pressing_item() {
    use Outcome::*;
    let ms = Duration::from_millis;
    let retry = || Retry("x".into(), None);
    let park = || Park("x".into());
    assert_eq!(Outcome::of_job(vec![Done, Done]), Done);
    assert_eq!(Outcome::of_job(vec![Done, park()]), Done);
    assert_eq!(Outcome::of_job(vec![park(), park()]), park());
    assert_eq!(Outcome::of_job(vec![Done, retry(), Leased(ms(5))]), retry());
    // A retry the database holds gives way to one only a redelivery would make.
    let recorded = || Retry("x".into(), Some(ms(9)));
    assert_eq!(Outcome::of_job(vec![recorded(), retry()]), retry());
    assert_eq!(Outcome::of_job(vec![recorded(), Done]), recorded());
    assert_eq!(
        Outcome::of_job(vec![Leased(ms(1)), Done, Leased(ms(3))]),
        Leased(ms(3))
    );
    assert_eq!(Outcome::of_job(vec![Superseded, Done, park()]), Superseded);
    assert_eq!(Outcome::of_job(vec![Done, Stopped]), Stopped);
    // A panic outside the work outranks all: it counts toward the job's dead letter.
    let panicked = || Panicked("p".into());
    assert_eq!(Outcome::of_job(vec![Done, panicked(), retry()]), panicked());
    assert_eq!(Outcome::of_job(vec![]), Done);
}

#[test]
fn a_transient_failure_of_the_last_attempt_is_final() {
    let backoff = Duration::from_secs(5);
    let transient = || Err(Failure::Transient("busy".into()));
    assert_eq!(
        Verdict::of(transient(), false, backoff),
        Verdict::Retry("busy".into(), backoff)
    );
    assert_eq!(
        Verdict::of(transient(), true, backoff),
        Verdict::Failed("busy".into())
    );
    let later = |s| Err(Failure::Later("slow down".into(), Duration::from_secs(s)));
    assert_eq!(
        Verdict::of(later(120), false, backoff),
        Verdict::Retry("slow down".into(), Duration::from_secs(120))
    );
    assert_eq!(
        Verdict::of(later(120), true, backoff),
        Verdict::Failed("slow down".into())
    );
    let refused = Err(Failure::Permanent("no".into()));
    assert_eq!(
        Verdict::of(refused, false, backoff),
        Verdict::Failed("no".into())
    );
    assert_eq!(
        Verdict::of(Ok("id".into()), true, backoff),
        Verdict::Done("id".into())
    );
}
