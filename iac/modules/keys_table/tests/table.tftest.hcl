# The keys table as the edge reads it, planned against a mocked AWS provider (no account needed):
# the two sparse indexes a page of keys is read from (edge/keys/dynamodb.py: KEYS_BY_OWNER,
# KEYS_BY_KIND, partition key the owner or the item's kind, sort key the id), and the edge allowed
# to Query them and nothing more on them: without the grant every listing was an AccessDenied.

mock_provider "aws" {
  override_during = plan

  mock_resource "aws_dynamodb_table" {
    defaults = { arn = "arn:aws:dynamodb:us-east-1:111122223333:table/fg-keys" }
  }

  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
}

variables {
  name               = "fg-keys"
  kms_key_arn        = "arn:aws:kms:us-east-1:111122223333:key/abc"
  edge_task_role_arn = "arn:aws:iam::111122223333:role/fg-edge-task"
}

run "the_listing_indexes_are_sparse_and_sorted_by_id" {
  command = plan

  assert {
    condition = {
      for index in aws_dynamodb_table.keys.global_secondary_index :
      index.name => [index.hash_key, index.range_key, index.projection_type]
      } == {
      keys_by_owner = ["owner", "id", "ALL"]
      keys_by_kind  = ["kind", "id", "ALL"]
    }
    error_message = "the key listing reads keys_by_owner (owner, id) and keys_by_kind (kind, id), every attribute projected"
  }

  assert {
    condition     = toset([for a in aws_dynamodb_table.keys.attribute : "${a.name}:${a.type}"]) == toset(["pk:S", "sk:S", "owner:S", "kind:S", "id:S"])
    error_message = "only the table's and the indexes' keys are declared, all strings"
  }
}

run "the_edge_may_query_the_indexes_and_no_more" {
  command = plan

  assert {
    condition = [
      for s in data.aws_iam_policy_document.edge.statement : [s.actions, s.resources] if s.sid == "KeysTableListing"
      ] == [[
        toset(["dynamodb:Query"]),
        toset([
          "arn:aws:dynamodb:us-east-1:111122223333:table/fg-keys/index/keys_by_owner",
          "arn:aws:dynamodb:us-east-1:111122223333:table/fg-keys/index/keys_by_kind",
        ]),
    ]]
    error_message = "the edge Queries the two listing indexes, and nothing else on any index"
  }
}
