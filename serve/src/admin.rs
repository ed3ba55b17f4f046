//! The model list and the hot-swap endpoints, shaped as the engines shape them: vLLM's
//! runtime LoRA loading (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, plain-text
//! success, vLLM error bodies) and SGLang's `/update_weights_from_disk` (`{success, message}`).

use std::path::PathBuf;
use std::sync::Arc;

use http::StatusCode;
use serde_json::json;

use super::app::{unix_seconds, App};
use super::error::ServeError;
use super::http::{json_response, text_response, Reply};
use super::protocol::{self, LoadAdapter, UnloadAdapter, UpdateWeights};
use super::shapes;

pub async fn models(app: &App) -> Reply {
    let entries = app.models().await?;
    let body = shapes::models(
        &entries,
        app.config.max_position_embeddings,
        unix_seconds(),
        &app.random_id(),
    );
    Ok(json_response(StatusCode::OK, &body))
}

pub async fn load_adapter(app: &Arc<App>, body: &[u8]) -> Reply {
    let request: LoadAdapter = protocol::parse(body)?;
    let (Some(name), Some(path)) = (request.lora_name, request.lora_path) else {
        return Err(ServeError::BadRequest(
            "Both 'lora_name' and 'lora_path' must be provided.".to_owned(),
        ));
    };
    app.load_requested_adapter(name.clone(), PathBuf::from(path))
        .await?;
    let message = format!("Success: LoRA adapter '{name}' added successfully.");
    Ok(text_response(StatusCode::OK, message))
}

pub async fn unload_adapter(app: &App, body: &[u8]) -> Reply {
    let request: UnloadAdapter = protocol::parse(body)?;
    let Some(name) = request.lora_name else {
        return Err(ServeError::BadRequest(
            "'lora_name' needs to be provided to unload a LoRA adapter.".to_owned(),
        ));
    };
    app.unload_adapter(name.clone()).await?;
    let message = format!("Success: LoRA adapter '{name}' removed successfully.");
    Ok(text_response(StatusCode::OK, message))
}

/// SGLang answers failures here with its own body (`success: false`), not an error object.
pub async fn update_weights(app: &Arc<App>, body: &[u8]) -> Reply {
    let outcome = match protocol::parse::<UpdateWeights>(body) {
        Ok(UpdateWeights {
            model_path: Some(path),
            ..
        }) => app.update_weights(PathBuf::from(path)).await,
        Ok(_) => Err(ServeError::BadRequest(
            "'model_path' must be provided.".to_owned(),
        )),
        Err(e) => Err(e),
    };
    let (status, success, message) = match outcome {
        Ok(()) => (
            StatusCode::OK,
            true,
            "Succeeded to update model weights.".to_owned(),
        ),
        Err(e) => (e.status(), false, format!("Failed to update weights: {e}")),
    };
    let body = json!({"success": success, "message": message, "num_paused_requests": 0});
    Ok(json_response(status, &body))
}
