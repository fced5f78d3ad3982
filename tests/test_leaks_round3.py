"""Nothing lost, nothing leaked, round 3 (issue 24): secret shapes the patterns let through, every
path that writes conversation text redacting it, unreadable or huge transcripts, progress kept per
source, a refused embedding input kept out of its neighbours' vectors, and progress on a terminal."""

import aokun

PATTERNS = aokun.load_secret_rules(aokun.HERE / "rules" / "secrets.toml")

# secret shapes -----------------------------------------------------------------------------------

#: synthetic secrets of the shapes round 3 found unredacted: (text, what it must become)
ROUND3_SHAPES = [
    ("app token xapp-1-A0123456789-1234567890123-0a1b2c3d4e5f6a7b8c9d end",
     "app token [REDACTED:slack_token] end"),
    ("refresh xoxe-1-My0xLTEyMzQ1Njc4OTAtMTIzNDU2Nzg5MDEyMw end", "refresh [REDACTED:slack_token] end"),
    ("rotated xoxe.xoxp-1-Mi0yLTEyMzQ1Njc4OTAtMTIzNDU2 end", "rotated [REDACTED:slack_token] end"),
    ("post to https://hooks.slack.com/services/T0FAKE0001/B0FAKE0002/Zz9fakeWebhookSecret12 now",
     "post to https://hooks.slack.com/services/[REDACTED:slack_webhook] now"),
    ("dsn postgresql://:Pg-fake-pass9@db.internal:5432/app",
     "dsn postgresql://:[REDACTED:connection_string]@db.internal:5432/app"),
    ("unsigned eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiIxMjM0NTY3ODkwIn0. end",
     "unsigned [REDACTED:jwt] end"),
    ("no signature eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiIxMjM0NTY3ODkwIn0 end",
     "no signature [REDACTED:jwt] end"),
]
#: prose with the prefixes as words: stays as written
ROUND3_NOT_SECRETS = [
    "The eyJ prefix means base64 JSON; eyJhbGciOiJIUzI1NiJ9 alone is only a header.",
    "Slack's xapp tokens start with xapp- and the docs call it an xapp token.",
    "see hooks.slack.com/services for the docs", "postgresql://db.internal:5432/app has no password",
]


def test_round3_secret_shapes_are_redacted_and_prose_is_not():
    assert [(t, aokun.redact(t, PATTERNS)) for t, want in ROUND3_SHAPES if aokun.redact(t, PATTERNS) != want] == []
    assert [t for t in ROUND3_NOT_SECRETS if aokun.redact(t, PATTERNS) != t] == []
