//! [`WriteOp`]: one recorder write, as the sidecar's journal and the Redis spool keep it, and
//! how it is applied to a [`Store`].
//!
//! It is written as an object that opens with its `op` (`{"op":"append_steps","steps":[...]}`).
//! serde reads such an internally tagged object by first copying all of it into a tree of its
//! own, every string of a step included, and a step's raw JSON cannot be kept through that tree;
//! so an op is read here in place: its `op` first, then its fields as the variant it names, and
//! the steps as the bytes they were written as ([`EncodedStep`]).

use std::fmt;

use serde::de::value::MapAccessDeserializer;
use serde::de::{
    self, DeserializeSeed, EnumAccess, IntoDeserializer, MapAccess, VariantAccess, Visitor,
};
use serde::{Deserialize, Deserializer, Serialize};

use crate::encoded::EncodedStep;
use crate::error::Result;
use crate::ids::{StepId, TenantId, TrajectoryId};
use crate::schema::{Evaluation, NextState, Trajectory};
use crate::store::{Complete, Completed, Store};

/// A recorder write.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum WriteOp {
    UpsertTrajectory {
        trajectory: Trajectory,
    },
    AppendSteps {
        steps: Vec<EncodedStep>,
    },
    SetNextState {
        tenant: TenantId,
        trajectory: TrajectoryId,
        step: StepId,
        next_state: NextState,
    },
    AppendEvaluations {
        evaluations: Vec<Evaluation>,
    },
    CompleteTrajectory {
        request: Complete,
    },
}

impl WriteOp {
    /// Applies the write to `store`; what a completion enqueued, for completions.
    pub async fn apply<S: Store + ?Sized>(&self, store: &S) -> Result<Option<Completed>> {
        match self {
            WriteOp::UpsertTrajectory { trajectory } => store.upsert_trajectory(trajectory).await?,
            WriteOp::AppendSteps { steps } => store.append_encoded_steps(steps).await?,
            WriteOp::SetNextState {
                tenant,
                trajectory,
                step,
                next_state,
            } => {
                store
                    .set_next_state(tenant, trajectory, step, next_state)
                    .await?
            }
            WriteOp::AppendEvaluations { evaluations } => {
                store.append_evaluations(evaluations).await?
            }
            WriteOp::CompleteTrajectory { request } => {
                return store.complete_trajectory(request).await.map(Some)
            }
        }
        Ok(None)
    }
}

/// The variants' fields, read once the `op` named the variant (serde's remote derive: the
/// fields are [`WriteOp`]'s own, checked against it by the compiler).
#[derive(Deserialize)]
#[serde(remote = "WriteOp", rename_all = "snake_case")]
enum Fields {
    UpsertTrajectory {
        trajectory: Trajectory,
    },
    AppendSteps {
        steps: Vec<EncodedStep>,
    },
    SetNextState {
        tenant: TenantId,
        trajectory: TrajectoryId,
        step: StepId,
        next_state: NextState,
    },
    AppendEvaluations {
        evaluations: Vec<Evaluation>,
    },
    CompleteTrajectory {
        request: Complete,
    },
}

impl<'de> Deserialize<'de> for WriteOp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_map(OpFirst)
    }
}

/// Reads the `op` that opens the object, then the rest as that variant's fields.
struct OpFirst;

impl<'de> Visitor<'de> for OpFirst {
    type Value = WriteOp;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a write op: an object that opens with its \"op\"")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<WriteOp, A::Error> {
        match map.next_key::<String>()? {
            Some(key) if key == "op" => {}
            Some(key) => {
                return Err(de::Error::custom(format!(
                    "a write op opens with its \"op\", not {key:?}"
                )))
            }
            None => return Err(de::Error::missing_field("op")),
        }
        let op: String = map.next_value()?;
        Fields::deserialize(Variant { op, fields: map })
    }
}

/// An op's name and the rest of its object, presented as the externally tagged variant
/// `{op: {fields}}` that [`Fields`] reads.
struct Variant<A> {
    op: String,
    fields: A,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for Variant<A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, A: MapAccess<'de>> EnumAccess<'de> for Variant<A> {
    type Error = A::Error;
    type Variant = Rest<A>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> std::result::Result<(V::Value, Rest<A>), A::Error> {
        let variant = seed.deserialize(self.op.into_deserializer())?;
        Ok((variant, Rest(self.fields)))
    }
}

/// The fields after the `op`.
struct Rest<A>(A);

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for Rest<A> {
    type Error = A::Error;

    fn unit_variant(self) -> std::result::Result<(), A::Error> {
        Err(de::Error::custom("every write op has fields"))
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> std::result::Result<T::Value, A::Error> {
        seed.deserialize(MapAccessDeserializer::new(self.0))
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        _len: usize,
        _visitor: V,
    ) -> std::result::Result<V::Value, A::Error> {
        Err(de::Error::custom("a write op's fields are named"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, A::Error> {
        visitor.visit_map(self.0)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::example::tool_use_trajectory;
    use crate::ids::UnixMs;

    fn ops() -> Vec<WriteOp> {
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        let record = tool_use_trajectory(tenant.clone());
        let step = &record.steps[0];
        vec![
            WriteOp::UpsertTrajectory {
                trajectory: record.trajectory.clone(),
            },
            WriteOp::AppendSteps {
                steps: vec![EncodedStep::encode(step).unwrap_or_else(|e| panic!("{e}"))],
            },
            WriteOp::SetNextState {
                tenant,
                trajectory: step.trajectory,
                step: step.id,
                next_state: NextState {
                    messages: vec![json!({"role": "tool", "content": "18 C"})],
                    observed_at: UnixMs(7),
                },
            },
            WriteOp::AppendEvaluations {
                evaluations: record.evaluations.clone(),
            },
        ]
    }

    #[test]
    fn every_op_reads_back_as_written_and_opens_with_its_op() {
        for op in ops() {
            let json = serde_json::to_string(&op).unwrap_or_else(|e| panic!("{e}"));
            assert!(json.starts_with("{\"op\":"), "{json}");
            let back: WriteOp = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back, op);
        }
    }

    #[test]
    fn a_step_reads_back_as_the_bytes_it_was_written_as() {
        let op = &ops()[1];
        let json = serde_json::to_string(op).unwrap_or_else(|e| panic!("{e}"));
        let WriteOp::AppendSteps { steps } =
            serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"))
        else {
            panic!("not a step append: {json}")
        };
        assert!(json.contains(steps[0].json()));
    }

    #[test]
    fn an_op_without_its_name_first_or_of_an_unknown_name_is_refused_with_what_was_wrong() {
        let late = r#"{"evaluations":[],"op":"append_evaluations"}"#;
        let err = serde_json::from_str::<WriteOp>(late)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("opens with")),
            "{err:?}"
        );
        let unknown = r#"{"op":"drop_tables"}"#;
        let err = serde_json::from_str::<WriteOp>(unknown)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("drop_tables")),
            "{err:?}"
        );
        let missing = r#"{"op":"append_steps"}"#;
        assert!(serde_json::from_str::<WriteOp>(missing).is_err());
    }
}
