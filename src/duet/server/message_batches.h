// Anthropic's Message Batches API (/v1/messages/batches) over the server's batches (batches.h):
// a batch's requests, {custom_id, params} each with params a Messages request, become a batch
// file of /v1/messages lines kept in the file store (purpose "batch"), which the BatchManager runs
// as it runs OpenAI's batches (beside live traffic, kept in --files-dir and gone on with after a
// restart, cancelled, expired after 24 hours). What the routes show is translated to Anthropic's
// shapes: the message_batch object (processing_status in_progress, canceling or ended; counts of
// processing, succeeded, errored, canceled and expired requests; RFC 3339 times; results_url once
// ended), the list pages (before_id, after_id, limit; first_id, last_id, has_more) and the results
// as JSON lines {custom_id, result: {type: succeeded, message} | {type: errored, error} |
// {type: canceled} | {type: expired}}, in the requests' order; a request a cancel (or the
// deadline) cut short is canceled (expired), not a message cut off. A batch's id is its OpenAI id with
// msgbatch_ for batch_ (the same batch under both APIs).
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "duet/server/batches.h"

namespace duet::server {

class MessageBatches {
 public:
  MessageBatches(FileStore& files, BatchManager& batches) : files_(files), batches_(batches) {}

  // Each returns Anthropic's object or throws ApiError (400, 404).
  nlohmann::json create(const nlohmann::json& body);
  nlohmann::json get(const std::string& id) const;
  // Newest first: the page after `after_id` (or before `before_id`, at most one of them), at most
  // `limit` (1 to 1000).
  nlohmann::json list(const std::string& before_id, const std::string& after_id, int64_t limit) const;
  nlohmann::json cancel(const std::string& id);
  // {id, type: message_batch_deleted}; only an ended batch (400 otherwise).
  nlohmann::json erase(const std::string& id);
  // The results file (JSON lines); 400 while the batch has not ended.
  std::string results(const std::string& id) const;

 private:
  // The OpenAI batch behind an Anthropic id (404 for an id of another shape or another kind of batch).
  nlohmann::json batch(const std::string& id) const;
  nlohmann::json to_anthropic(const nlohmann::json& batch) const;
  // Each answered request's result by custom_id, from the batch's output and error files.
  std::unordered_map<std::string, nlohmann::json> answered(const nlohmann::json& batch) const;

  FileStore& files_;
  BatchManager& batches_;
  // Of each ended cancelled or expired batch (by its OpenAI id), how many requests its cancel or
  // deadline cut short with part of a message: counted from its output files once (an ended batch
  // never changes), not on every retrieval and listing.
  mutable std::mutex cut_mutex_;
  mutable std::unordered_map<std::string, int64_t> cut_short_;
};

}  // namespace duet::server
