//! POST /v1/completions: one prompt (text, tokenised with the tokenizer's special tokens as
//! vLLM does, or token ids), answered as one body or as vLLM's completion chunks — every key
//! present in every chunk, `prompt_token_ids` on the first one's choice.

use std::sync::Arc;

use serde_json::{json, Value};

use super::app::{unix_seconds, App};
use super::engine::SampledToken;
use super::error::ServeError;
use super::http::{json_response, sse_response, Reply, SseSender};
use super::protocol::{self, Checked, CompletionRequest, LogprobsCount, Prompt, StreamOptions};
use super::reply::{self, Chunk, Chunker, Finish, Generation};
use super::shapes;

pub async fn handle(app: Arc<App>, body: &[u8]) -> Reply {
    let request: CompletionRequest = protocol::parse(body)?;
    let checked = request.sampling.check(request.sampling.max_tokens)?;
    let top_logprobs = request.top_logprobs()?;
    if request.echo {
        return Err(ServeError::BadRequest(
            "echo is not supported by clawback-serve.".to_owned(),
        ));
    }
    let prompt = match &request.prompt {
        Prompt::Text(text) => app.tokenizer.encode(text, true)?,
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Texts(texts) if texts.len() == 1 => app.tokenizer.encode(&texts[0], true)?,
        Prompt::IdLists(lists) if lists.len() == 1 => lists[0].clone(),
        _ => {
            return Err(ServeError::BadRequest(
                "clawback-serve takes one prompt per request (send a request per prompt)."
                    .to_owned(),
            ))
        }
    };
    let generation = reply::start(
        &app,
        request.model.clone(),
        prompt,
        &checked,
        top_logprobs,
        "prompt",
    )
    .await?;
    let call = Call {
        id: format!("cmpl-{}", app.random_id()),
        created: unix_seconds(),
        model: request
            .model
            .clone()
            .unwrap_or_else(|| app.base_name.clone()),
        request,
        checked,
        app,
    };
    if call.request.stream {
        let (sse, response) = sse_response();
        tokio::spawn(call.stream(generation, sse));
        Ok(response)
    } else {
        let body = call.whole(generation).await?;
        Ok(json_response(http::StatusCode::OK, &body))
    }
}

/// One text completion being answered.
struct Call {
    app: Arc<App>,
    request: CompletionRequest,
    checked: Checked,
    id: String,
    created: u64,
    model: String,
}

impl Call {
    fn logprobs(&self, tokens: &[SampledToken], offset: usize) -> Value {
        let wanted = self
            .request
            .logprobs
            .and_then(LogprobsCount::count)
            .is_some();
        shapes::completion_logprobs(&self.app.tokenizer, wanted, tokens, offset)
    }

    async fn whole(&self, mut generation: Generation) -> Result<Value, ServeError> {
        let mut text = reply::text_stream(&self.app, &self.checked);
        let (tokens, all, finish) = generation.collect(&mut text).await?;
        let ids = self.request.return_token_ids;
        Ok(json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0, "text": all, "logprobs": self.logprobs(&tokens, 0),
                "finish_reason": finish.reason, "stop_reason": finish.stop_reason,
                "token_ids": shapes::token_ids(ids, &tokens),
                "prompt_logprobs": null,
                "prompt_token_ids": shapes::prompt_ids(ids, &generation.prompt),
                "routed_experts": null
            }],
            "service_tier": null,
            "system_fingerprint": shapes::SYSTEM_FINGERPRINT,
            "usage": shapes::usage(generation.prompt.len(), tokens.len(), true),
            "kv_transfer_params": null,
            "ec_transfer_params": null,
            "metrics": null
        }))
    }

    fn chunk(
        &self,
        text: &str,
        tokens: &[SampledToken],
        offset: usize,
        finish: Option<&Finish>,
        prompt: Option<&[i64]>,
    ) -> Value {
        let ids = self.request.return_token_ids;
        // vLLM 0.32's completion chunk: no prompt_logprobs, no usage; the last one names the
        // system.
        let mut chunk = json!({
            "id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0, "text": text, "logprobs": self.logprobs(tokens, offset),
                "finish_reason": finish.map(|f| f.reason),
                "stop_reason": finish.map_or(Value::Null, |f| f.stop_reason.clone()),
                "prompt_token_ids": prompt.map_or(Value::Null, |p| shapes::prompt_ids(ids, p)),
                "token_ids": shapes::token_ids(ids, tokens)
            }]
        });
        if finish.is_some() {
            chunk["system_fingerprint"] = json!(shapes::SYSTEM_FINGERPRINT);
        }
        chunk
    }

    async fn stream(self, mut generation: Generation, sse: SseSender) {
        match self.stream_tokens(&mut generation, &sse).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                let _ = sse.data(&error.body()).await;
            }
        }
        sse.done().await;
    }

    /// One chunk per token, the finish on the last token's; Ok(false) when the client left.
    async fn stream_tokens(
        &self,
        generation: &mut Generation,
        sse: &SseSender,
    ) -> Result<bool, ServeError> {
        let mut text = reply::text_stream(&self.app, &self.checked);
        let mut chunker = Chunker::default();
        let mut offset = 0;
        let mut count = 0;
        let mut first = true;
        while let Some(update) = generation.next(&mut text).await? {
            count += usize::from(update.token.is_some());
            let (tokens, shown, finish) = match chunker.take(update) {
                None => continue,
                Some(Chunk::Token(token, shown)) => (vec![token], shown, None),
                Some(Chunk::Last(tokens, shown, finish)) => (tokens, shown, Some(finish)),
            };
            let prompt = first.then_some(generation.prompt.as_slice());
            first = false;
            let chunk = self.chunk(&shown, &tokens, offset, finish.as_ref(), prompt);
            offset += shown.len();
            if !sse.data(&chunk).await {
                return Ok(false);
            }
            if finish.is_none() {
                continue;
            }
            if !StreamOptions::wants_usage(&self.request.stream_options) {
                return Ok(true);
            }
            let usage = shapes::usage_chunk(
                &self.id,
                "text_completion",
                self.created,
                &self.model,
                generation.prompt.len(),
                count,
            );
            return Ok(sse.data(&usage).await);
        }
        Err(ServeError::WorkerGone)
    }
}
