"""Where bytes live: local folders, buckets (local S3 and GCS servers), the atomic write."""
