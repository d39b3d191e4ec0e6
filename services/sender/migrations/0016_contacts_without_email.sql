-- A contact may be known by its external id alone (an event about a contact not seen before
-- makes one); it has no email until one is given, and sends skip it. Every contact is named
-- by one of the two.
ALTER TABLE contacts ALTER COLUMN email DROP NOT NULL;
ALTER TABLE contacts ALTER COLUMN email_key DROP NOT NULL;
ALTER TABLE contacts ADD CONSTRAINT contacts_named
    CHECK (email_key IS NOT NULL OR external_id IS NOT NULL);
