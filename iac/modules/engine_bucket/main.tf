# Built TensorRT-LLM engines, one prefix per model and GPU type. Versioned so a bad build can be
# rolled back; private, KMS-encrypted, reachable over TLS only.

resource "aws_s3_bucket" "engines" {
  #checkov:skip=CKV_AWS_144:engines are rebuilt from the checkpoint in any region; replication would double tens of GB per build
  #checkov:skip=CKV2_AWS_62:nothing reacts to a new engine; hosts pick it up on the next instance refresh
  bucket = var.name
}

resource "aws_s3_bucket_public_access_block" "engines" {
  bucket                  = aws_s3_bucket.engines.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "engines" {
  bucket = aws_s3_bucket.engines.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "engines" {
  bucket = aws_s3_bucket.engines.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "engines" {
  bucket = aws_s3_bucket.engines.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    # One data key per bucket instead of per object: hosts read thousands of engine parts.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "engines" {
  bucket = aws_s3_bucket.engines.id
  rule {
    id     = "expire-replaced-engines"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_days
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }
}

resource "aws_s3_bucket_logging" "engines" {
  bucket        = aws_s3_bucket.engines.id
  target_bucket = var.log_bucket
  target_prefix = "${var.log_prefix}${var.name}/"
}

data "aws_iam_policy_document" "engines" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.engines.arn, "${aws_s3_bucket.engines.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "engines" {
  bucket     = aws_s3_bucket.engines.id
  policy     = data.aws_iam_policy_document.engines.json
  depends_on = [aws_s3_bucket_public_access_block.engines]
}
