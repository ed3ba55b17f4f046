//! A step serialised once. The recorder encodes a step when its call ends; the journal's line,
//! the spool's row and the store's entry all carry those same bytes, and a store files them under
//! the keys read off the step, so no step is serialised twice on its way to Redis or SQLite, nor
//! parsed back into a [`Step`] when a journal or spool replays it.
//!
//! The bytes are the step's JSON as a [`Step`] serialises, its token ids and logprobs packed
//! ([`crate::packed`]): every reader of a stored step reads them, and steps stored before.

use std::sync::Arc;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::codec::decode;
use crate::error::{Error, Result};
use crate::ids::{StepId, TenantId, TrajectoryId};
use crate::packed::packed;
use crate::schema::{check_version, Step};

/// A step as the stores keep it, with the keys they file it under.
#[derive(Clone, Debug)]
pub struct EncodedStep {
    tenant: TenantId,
    trajectory: TrajectoryId,
    id: StepId,
    /// The step's JSON; shared, so a batch split into single writes copies no bytes.
    json: Arc<RawValue>,
}

/// The keys of a step, read from its JSON without building the rest of it.
#[derive(Deserialize)]
struct Keys {
    #[serde(default)]
    schema_version: u32,
    tenant: TenantId,
    trajectory: TrajectoryId,
    id: StepId,
}

impl EncodedStep {
    /// Serialises `step`, its token ids and logprobs packed ([`crate::packed`]).
    pub fn encode(step: &Step) -> Result<Self> {
        // Serialised straight into the raw value: `RawValue::from_string` would parse it again.
        let json = packed(|| serde_json::value::to_raw_value(step))
            .map_err(|e| Error::codec("step", e))?;
        Ok(EncodedStep {
            tenant: step.tenant.clone(),
            trajectory: step.trajectory,
            id: step.id,
            json: Arc::from(json),
        })
    }

    /// A stored step's JSON, checked for its keys and schema version only.
    pub fn from_json(json: Box<RawValue>) -> Result<Self> {
        let keys: Keys = decode("step", json.get())?;
        check_version("step", keys.schema_version)?;
        Ok(EncodedStep {
            tenant: keys.tenant,
            trajectory: keys.trajectory,
            id: keys.id,
            json: Arc::from(json),
        })
    }

    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    pub fn trajectory(&self) -> TrajectoryId {
        self.trajectory
    }

    pub fn id(&self) -> StepId {
        self.id
    }

    /// The step's JSON, as stored.
    pub fn json(&self) -> &str {
        self.json.get()
    }

    /// The step itself.
    pub fn decode(&self) -> Result<Step> {
        decode("step", self.json())
    }
}

/// Written as the step's JSON itself (by serde_json, the only serializer the journal and spool
/// use): a record holding an encoded step reads exactly as one holding the [`Step`].
impl Serialize for EncodedStep {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        (*self.json).serialize(serializer)
    }
}

impl PartialEq for EncodedStep {
    fn eq(&self, other: &Self) -> bool {
        self.json() == other.json()
    }
}

impl<'de> Deserialize<'de> for EncodedStep {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let json = Box::<RawValue>::deserialize(deserializer)?;
        EncodedStep::from_json(json).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::tool_use_trajectory;

    fn step() -> Step {
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        tool_use_trajectory(tenant).steps.remove(1)
    }

    #[test]
    fn an_encoded_step_is_written_as_its_bytes_and_decodes_to_the_step() {
        let step = step();
        let encoded = EncodedStep::encode(&step).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            encoded.json().contains(r#""completion_logprobs":{"#),
            "packed: {}",
            encoded.json()
        );
        assert_eq!(
            serde_json::to_string(&encoded).unwrap_or_else(|e| panic!("{e}")),
            encoded.json()
        );
        assert_eq!(encoded.decode().unwrap_or_else(|e| panic!("{e}")), step);
        assert_eq!(
            (encoded.tenant(), encoded.trajectory(), encoded.id()),
            (&step.tenant, step.trajectory, step.id)
        );
    }

    #[test]
    fn a_record_written_with_steps_reads_as_encoded_steps_with_their_keys() {
        let step = step();
        #[derive(Serialize)]
        struct Old<'a> {
            steps: Vec<&'a Step>,
        }
        #[derive(Deserialize)]
        struct New {
            steps: Vec<EncodedStep>,
        }
        let line =
            serde_json::to_string(&Old { steps: vec![&step] }).unwrap_or_else(|e| panic!("{e}"));
        let read: New = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read.steps[0].id(), step.id);
        assert_eq!(read.steps[0].tenant(), &step.tenant);
        assert_eq!(
            read.steps[0].decode().unwrap_or_else(|e| panic!("{e}")),
            step
        );
    }

    #[test]
    fn a_step_of_a_newer_schema_or_without_its_keys_is_refused() {
        let mut value = serde_json::to_value(step()).unwrap_or_else(|e| panic!("{e}"));
        value["schema_version"] = (crate::schema::SCHEMA_VERSION + 1).into();
        let newer = RawValue::from_string(value.to_string()).unwrap_or_else(|e| panic!("{e}"));
        assert!(EncodedStep::from_json(newer).is_err());
        let keyless =
            RawValue::from_string(r#"{"index":0}"#.into()).unwrap_or_else(|e| panic!("{e}"));
        assert!(EncodedStep::from_json(keyless).is_err());
    }
}
