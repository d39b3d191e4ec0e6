//! The JSON Schema of a workflow's definition: what [`super::Workflow::parse`] accepts.

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::audience::audiences::{compared, Condition};
use crate::audience::contacts::name_schema;
use crate::model::schema::{self, component};

use super::{Cond, Rule, Step, Workflow, MAX_CONDITIONS, MAX_EXITS, MAX_STEPS, MAX_WAIT_SECS};

/// A reference to the component `T` names.
fn reference<T: ToSchema>() -> Ref {
    Ref::from_schema_name(T::name())
}

/// A condition as `Cond::parse` takes it: on the contact, or on the event's properties.
impl PartialSchema for Cond {
    fn schema() -> RefOr<Schema> {
        let property = |op, value| compared("property", op, value);
        OneOfBuilder::new()
            .description(Some(
                "A condition on the contact, or `{property, op, value}` on the triggering \
                 event's properties: `op` `eq` (the default), `neq`, `gt` or `lt` a value, \
                 `exists`, or `in` a non-empty array.",
            ))
            .item(reference::<Condition>())
            .item(property(
                schema::one_of_strings(&["eq", "neq", "gt", "lt"]),
                Some(schema::not_null().into()),
            ))
            .item(property(schema::one_of_strings(&["exists"]), None).required("op"))
            .item(
                property(
                    schema::one_of_strings(&["in"]),
                    Some(ArrayBuilder::new().min_items(Some(1)).into()),
                )
                .required("op"),
            )
            .into()
    }
}

component!(Cond as "WorkflowCondition" refers Condition);

/// Conditions as [`conditions`] takes them.
fn conditions_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(reference::<Cond>())
        .max_items(Some(MAX_CONDITIONS))
}

/// A rule as `Rule::parse` takes it.
impl PartialSchema for Rule {
    fn schema() -> RefOr<Schema> {
        schema::closed()
            .description(Some(
                "A trigger or exit rule: an event name and conditions that must all hold.",
            ))
            .property("event_name", name_schema())
            .required("event_name")
            .property("conditions", conditions_schema())
            .into()
    }
}

component!(Rule as "WorkflowRuleDefinition" refers Cond);

/// A step as `compile` takes it: `send`, `wait` or `branch`. Left out: branches nest at most
/// five deep, and a workflow has at most 100 steps in all, its branches' included.
impl PartialSchema for Step {
    fn schema() -> RefOr<Schema> {
        let step = |kind: &str| {
            schema::closed()
                .property("type", schema::one_of_strings(&[kind]))
                .required("type")
        };
        let steps = || {
            ArrayBuilder::new()
                .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
                .items(reference::<Step>())
        };
        let branch = |condition: &str, schema: RefOr<Schema>| {
            step("branch")
                .property(condition, schema)
                .required(condition)
                .property("then", steps())
                .property("else", steps())
        };
        OneOfBuilder::new()
            .description(Some(
                "`send` a template to the contact, `wait` some seconds or until the time in \
                 one of the event's properties, or `branch` on conditions.",
            ))
            .item(
                step("send")
                    .property("templateKey", name_schema())
                    .required("templateKey")
                    .property(
                        "emailType",
                        schema::unless_string(schema::email_type()).description(Some(
                            "`transactional`, `lifecycle` (the default) or `marketing`",
                        )),
                    )
                    .property("topic", schema::or_null(name_schema())),
            )
            .item(
                step("wait")
                    .property(
                        "seconds",
                        ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .minimum(Some(0))
                            .maximum(Some(MAX_WAIT_SECS)),
                    )
                    .required("seconds"),
            )
            .item(
                step("wait")
                    .property("until", name_schema())
                    .required("until"),
            )
            .item(branch("condition", reference::<Cond>().into()))
            .item(branch(
                "conditions",
                conditions_schema().min_items(Some(1)).into(),
            ))
            .into()
    }
}

component!(Step as "WorkflowStep" refers Cond);

/// A workflow as [`Workflow::parse`] takes it (a [`WorkflowBody`]).
impl PartialSchema for Workflow {
    fn schema() -> RefOr<Schema> {
        schema::closed()
            .description(Some("A workflow as the API takes it."))
            .property("name", name_schema())
            .required("name")
            .property("trigger", reference::<Rule>())
            .required("trigger")
            .property(
                "exit",
                ArrayBuilder::new()
                    .items(reference::<Rule>())
                    .max_items(Some(MAX_EXITS)),
            )
            .property("reentry", ObjectBuilder::new().schema_type(Type::Boolean))
            .property(
                "steps",
                ArrayBuilder::new()
                    .items(reference::<Step>())
                    .min_items(Some(1))
                    .max_items(Some(MAX_STEPS)),
            )
            .required("steps")
            .into()
    }
}

component!(Workflow as "WorkflowDefinition" refers Rule, Step);
