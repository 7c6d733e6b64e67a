# Conversation messages, as edge/messages/dynamodb.py writes them: partition key conversation_id,
# sort key message_id (time-ordered), the owner checked on read, expires_at for TTL. On-demand
# billing: message writes follow traffic, which is spiky and unknown ahead of time.

resource "aws_dynamodb_table" "messages" {
  name                        = var.name
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "conversation_id"
  range_key                   = "message_id"
  deletion_protection_enabled = true

  attribute {
    name = "conversation_id"
    type = "S"
  }

  attribute {
    name = "message_id"
    type = "S"
  }

  ttl {
    attribute_name = "expires_at"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }
}
