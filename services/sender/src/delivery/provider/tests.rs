//! The provider intake's own checks: SNS envelopes and SES events.

use super::*;
use serde_json::json;

#[test]
fn the_canonical_string_follows_snss_field_order() {
    let env: Envelope = serde_json::from_value(json!({
        "Type": "Notification", "MessageId": "m1", "TopicArn": "arn:t", "Message": "hi",
        "Timestamp": "2026-01-01T00:00:00.000Z", "SignatureVersion": "2", "Signature": "x",
        "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/c.pem"
    }))
    .unwrap();
    assert_eq!(
        env.canonical().unwrap(),
        "Message\nhi\nMessageId\nm1\nTimestamp\n2026-01-01T00:00:00.000Z\nTopicArn\narn:t\nType\nNotification\n"
    );
    let pattern = Regex::new(crate::settings::SNS_URL_PATTERN.default).unwrap();
    assert!(pattern.is_match("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-1.pem"));
    assert!(pattern.is_match("https://sns.cn-north-1.amazonaws.com.cn/x.pem"));
    assert!(pattern.is_match("https://sns.us-gov-west-1.amazonaws.com/x.pem"));
    assert!(pattern.is_match("https://sns.ap-southeast-2.amazonaws.com/x.pem"));
    for elsewhere in [
        "https://sns.eu-west-1.amazonaws.com.evil.example/x.pem",
        "http://sns.eu-west-1.amazonaws.com/x.pem",
        // An S3 bucket named `sns`, whoever holds it, in its virtual-hosted forms.
        "https://sns.s3.amazonaws.com/x.pem",
        "https://sns.s3-us-west-2.amazonaws.com/x.pem",
        "https://sns.s3-external-1.amazonaws.com/x.pem",
    ] {
        assert!(!pattern.is_match(elsewhere), "{elsewhere}");
    }
}
